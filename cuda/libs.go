package cuda

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/ebitengine/purego"
)

// Library is a CUDA math library found on this machine (or the reason it was not).
type Library struct {
	Name    string // "cublas" or "cusolver"
	Path    string // file that loaded; the soname alone when the system loader found it
	Version string // major.minor.patch from the library itself
	Handle  uintptr
	Err     error // why it was not loaded; nil when Handle is valid
}

func (l Library) String() string {
	if l.Err != nil {
		return fmt.Sprintf("%s: not found (%v)", l.Name, l.Err)
	}
	return fmt.Sprintf("%s %s: %s", l.Name, l.Version, l.Path)
}

// mathLibraries: sonames in order of preference and the function that reports the version
// (cublasGetProperty and cusolverGetProperty take MAJOR_VERSION=0, MINOR=1, PATCH=2).
var mathLibraries = []struct {
	name, versionFunc string
	sonames           []string
}{
	{"cublas", "cublasGetProperty", []string{"libcublas.so.13", "libcublas.so.12"}},
	{"cusolver", "cusolverGetProperty", []string{"libcusolver.so.12", "libcusolver.so.11"}},
}

// LibraryDirEnv names directories (colon-separated) searched first for cuBLAS and cuSOLVER.
const LibraryDirEnv = "QPACK_CUDA_LIB_DIR"

// LibrarySearchDirs lists the directories searched for the math libraries, in order: those in
// $QPACK_CUDA_LIB_DIR, the CUDA toolkit's, then the lib folders of pip nvidia-* wheels. After
// them the system loader is asked for the bare soname (LD_LIBRARY_PATH, ld.so.cache).
func LibrarySearchDirs() []string {
	var dirs []string
	for _, d := range strings.Split(os.Getenv(LibraryDirEnv), ":") {
		if d != "" {
			dirs = append(dirs, d)
		}
	}
	dirs = append(dirs, "/usr/local/cuda/targets/x86_64-linux/lib", "/usr/local/cuda/lib64")
	var roots []string
	if v := os.Getenv("VIRTUAL_ENV"); v != "" {
		roots = append(roots, v+"/lib")
	}
	if h, err := os.UserHomeDir(); err == nil {
		roots = append(roots, h+"/.local/lib")
	}
	roots = append(roots, "/usr/local/lib", "/usr/lib", "/opt/*/.venv/lib", "/opt/conda/lib")
	for _, r := range roots {
		for _, pkgs := range []string{"site-packages", "dist-packages"} {
			found, _ := filepath.Glob(filepath.Join(r, "python3*", pkgs, "nvidia", "*", "lib"))
			dirs = append(dirs, found...)
		}
	}
	return dirs
}

// FindLibraries looks for cuBLAS and cuSOLVER and loads the first usable copy of each. It
// needs no GPU; the result says what was found where, or why not.
func FindLibraries() []Library {
	dirs := LibrarySearchDirs()
	libs := make([]Library, len(mathLibraries))
	for i, m := range mathLibraries {
		libs[i] = findLibrary(m.name, m.versionFunc, m.sonames, dirs)
	}
	return libs
}

func findLibrary(name, versionFunc string, sonames, dirs []string) Library {
	var failures []string
	try := func(path string) (Library, bool) {
		h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
		if err != nil {
			failures = append(failures, err.Error())
			return Library{}, false
		}
		lib := Library{Name: name, Path: path, Handle: h}
		lib.Version = libraryVersion(h, versionFunc)
		return lib, true
	}
	for _, dir := range dirs {
		for _, so := range sonames {
			path := filepath.Join(dir, so)
			if _, err := os.Stat(path); err != nil {
				continue
			}
			if lib, ok := try(path); ok {
				return lib
			}
		}
	}
	for _, so := range sonames {
		if lib, ok := try(so); ok {
			return lib
		}
	}
	return Library{Name: name, Err: fmt.Errorf("tried %s in %s and the system loader: %s",
		strings.Join(sonames, ", "), strings.Join(dirs, ", "), strings.Join(failures, "; "))}
}

func libraryVersion(h uintptr, versionFunc string) string {
	var getProperty func(kind int32, value *int32) int32
	if err := bindSymbol(h, &getProperty, []string{versionFunc}); err != nil {
		return "unknown"
	}
	var v [3]int32
	for kind := range v {
		if getProperty(int32(kind), &v[kind]) != 0 {
			return "unknown"
		}
	}
	return fmt.Sprintf("%d.%d.%d", v[0], v[1], v[2])
}
