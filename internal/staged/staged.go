// Package staged writes an output under a hidden temporary name beside its destination and
// renames it into place only when it is complete, so that a failed, interrupted or killed run
// never leaves anything that looks finished; the next run removes what a dead run left.
//
// A staging entry is named "." + base + ".tmp-" + random and holds an advisory lock (flock) for
// as long as its writer runs — on a staging file itself, in a staging directory on a lock file
// inside it — so Clean tells the leftovers of dead runs from outputs still being written, also by
// another process, pod or machine sharing the file system (the kernel, or an NFS server when its
// lease expires, drops a dead process's locks). Outputs are created with the usual permissions under the user's umask (0644 files, 0755
// directories under umask 022), as any other file the user writes, so that other users (an
// ollama or vLLM service, say) can read them.
package staged

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// CheckDestination refuses to start when dst exists, unless overwriting was asked for.
func CheckDestination(dst string, overwrite bool) error {
	if _, err := os.Stat(dst); err == nil && !overwrite {
		return fmt.Errorf("output %s already exists (use --overwrite to replace it)", dst)
	}
	return nil
}

// lockName is the lock file inside a staging directory; it is removed before the rename.
const lockName = ".qpack-staging.lock"

// Dir builds the directory dst: write fills a fresh staging directory beside it, which is
// renamed to dst when write succeeds (replacing dst when overwrite is set) and removed when it
// fails. Leftovers of dead runs for dst are removed first, each reported to log (nil discards).
func Dir(dst string, overwrite bool, log io.Writer, write func(dir string) error) (err error) {
	if err := CheckDestination(dst, overwrite); err != nil {
		return err
	}
	var lock *os.File
	tmp, err := create(dst, log, func(name string) error {
		if err := os.Mkdir(name, 0o777); err != nil {
			return err
		}
		lock, err = lockedFile(filepath.Join(name, lockName))
		return err
	})
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
			lock.Close()
		}
	}()
	if err = write(tmp); err != nil {
		return err
	}
	if err = os.Remove(filepath.Join(tmp, lockName)); err != nil {
		return err
	}
	if overwrite {
		if err = os.RemoveAll(dst); err != nil {
			return err
		}
	}
	if err = os.Rename(tmp, dst); err != nil {
		return err
	}
	return lock.Close()
}

// File writes the file dst through write, into a staging file beside it that is renamed to dst
// when write succeeds (with sync, flushed to disk first, so that it survives a power loss right
// after), and removed when it fails. Leftovers of dead runs for dst are removed first, each
// reported to log (nil discards).
func File(dst string, log io.Writer, sync bool, write func(f *os.File) error) (err error) {
	var f *os.File
	tmp, err := create(dst, log, func(name string) error {
		var err error
		f, err = lockedFile(name)
		return err
	})
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err = write(f); err != nil {
		return err
	}
	if sync {
		if err = f.Sync(); err != nil {
			return err
		}
	}
	if err = os.Rename(tmp, dst); err != nil {
		return err
	}
	return f.Close()
}

// lockedFile creates the file name (it must not exist) and takes an exclusive lock on it.
func lockedFile(name string) (*os.File, error) {
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o666)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		os.Remove(name)
		return nil, fmt.Errorf("%s: lock: %w", name, err)
	}
	return f, nil
}

// create cleans dst's leftovers, then makes a staging entry for dst with mk.
func create(dst string, log io.Writer, mk func(name string) error) (string, error) {
	dst = filepath.Clean(dst)
	parent := filepath.Dir(dst)
	if err := os.MkdirAll(parent, 0o777); err != nil {
		return "", err
	}
	removed, err := Clean(dst)
	for _, r := range removed {
		if log != nil {
			fmt.Fprintf(log, "removed %s, left by a run that did not finish\n", r)
		}
	}
	if err != nil {
		return "", err
	}
	for range 8 {
		name := filepath.Join(parent, prefix(dst)+randomTag())
		err := mk(name)
		if err == nil {
			return name, nil
		}
		if !errors.Is(err, os.ErrExist) {
			return "", err
		}
	}
	return "", fmt.Errorf("%s: could not create a staging name beside it", dst)
}

// Clean removes the staging entries of dst whose writers are gone (their lock is free), and
// returns their paths. Entries still locked, and names it does not recognise, are left alone.
func Clean(dst string) ([]string, error) {
	dst = filepath.Clean(dst)
	entries, err := os.ReadDir(filepath.Dir(dst))
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), prefix(dst)) {
			continue
		}
		p := filepath.Join(filepath.Dir(dst), e.Name())
		lock := p
		if e.IsDir() {
			lock = filepath.Join(p, lockName)
		}
		if !abandoned(lock) {
			continue
		}
		if err := os.RemoveAll(p); err != nil {
			return removed, fmt.Errorf("removing %s, left by a run that did not finish: %w", p, err)
		}
		removed = append(removed, p)
	}
	return removed, nil
}

// prefix is the start of every staging name of dst.
func prefix(dst string) string { return "." + filepath.Base(dst) + ".tmp-" }

// abandoned says whether the staging lock file exists and nobody holds its lock.
func abandoned(lock string) bool {
	f, err := os.OpenFile(lock, os.O_RDWR, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil
}

func randomTag() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
