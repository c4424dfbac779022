package blas

import (
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
	"time"
)

// Path is the CPU matrix path of this process: the engine products run on, its kernel, and why.
type Path struct {
	Kernel      string // the Go engine's micro-kernel, e.g. "avx512 14×32"
	SIMD        bool   // Kernel runs on the CPU's vector units (else it is the portable Go one)
	UseOpenBLAS bool   // Sgemm calls OpenBLAS; SgemmSerial and SyrkT64 always run the Go engine
	Library     string // the OpenBLAS Sgemm calls, "" when it does not
	Reason      string // why this path was chosen

	kernel *kernel
	lib    *library
}

// Setting is the environment variable that overrides the choice: go (the Go engine), openblas
// (OpenBLAS when it loads) or portable (the Go engine without SIMD, for comparisons).
const Setting = "QPACK_BLAS"

var (
	pathOnce sync.Once
	path     Path
)

// current returns the path, chosen on first use.
func current() *Path {
	pathOnce.Do(func() { path = choose(os.Getenv(Setting), simdKernels(), openBLAS) })
	return &path
}

// Current returns the path products take in this process.
func Current() Path { return *current() }

// choose picks the path. The rule (docs/cpu.md has the measurements behind it): the Go engine
// with this CPU's SIMD kernel measured as fast as OpenBLAS, so it runs whenever there is one and
// keeps results independent of what is installed; without one, OpenBLAS when it loads, since
// portable Go is tens of times slower.
func choose(setting string, simd []*kernel, load func() (*library, error)) Path {
	best := portable
	if len(simd) > 0 {
		best = simd[0]
	}
	p := Path{kernel: best}
	useLibrary := func(why string) bool {
		lib, err := load()
		if err != nil {
			p.Reason = fmt.Sprintf("%s, but %v", why, err)
			return false
		}
		p.lib, p.UseOpenBLAS, p.Reason = lib, true, why
		return true
	}
	switch setting {
	case "go":
		p.Reason = Setting + "=go"
	case "portable":
		p.kernel, p.Reason = portable, Setting+"=portable"
	case "openblas":
		useLibrary(Setting + "=openblas")
	default:
		prefix := ""
		if setting != "" && setting != "auto" {
			prefix = fmt.Sprintf("%s=%q is not go, openblas or portable (ignored); ", Setting, setting)
		}
		switch {
		case best.simd:
			p.Reason = prefix + "SIMD kernel for this CPU, measured as fast as OpenBLAS"
		case !useLibrary(prefix + "no SIMD kernel for this CPU; OpenBLAS is faster than portable Go"):
			p.Reason = prefix + "no SIMD kernel for this CPU and no OpenBLAS: portable Go"
		}
	}
	p.Kernel = fmt.Sprintf("%s %d×%d", p.kernel.name, p.kernel.mr, p.kernel.nr)
	p.SIMD = p.kernel.simd
	if p.lib != nil {
		p.Library = p.lib.path
	}
	return p
}

// SlowNote is a line for a command's log when products run in portable Go (no SIMD kernel and
// no OpenBLAS), "" otherwise.
func (p Path) SlowNote() string {
	if p.SIMD || p.UseOpenBLAS {
		return ""
	}
	return fmt.Sprintf("note: matrix products run in portable Go (%s), tens of times slower than with SIMD; `qpack doctor` says more", p.Reason)
}

// Available reports whether OpenBLAS loads (whether or not Sgemm uses it) and by which name.
func Available() (path string, ok bool) {
	l, err := openBLAS()
	if err != nil {
		return "", false
	}
	return l.path, true
}

// LoadErr says why OpenBLAS does not load (every name tried and why it failed); nil when it does.
func LoadErr() error {
	_, err := openBLAS()
	return err
}

// Threads is the number of goroutines Sgemm runs on.
func Threads() int { return runtime.GOMAXPROCS(0) }

// Measure times Sgemm on 512×512×512 products for about d and returns the best rate seen, in
// GFLOP/s: the path's speed on this machine now.
func Measure(d time.Duration) float64 {
	const n = 512
	r := rand.New(rand.NewPCG(1, 2))
	a, b, c := make([]float32, n*n), make([]float32, n*n), make([]float32, n*n)
	for i := range a {
		a[i], b[i] = r.Float32(), r.Float32()
	}
	best := 0.0
	for start := time.Now(); time.Since(start) < d || best == 0; {
		t := time.Now()
		SgemmNT(n, n, n, a, n, b, n, c, n)
		best = max(best, 2*n*n*n/time.Since(t).Seconds()/1e9)
	}
	return best
}
