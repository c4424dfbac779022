//go:build linux

package safetensors

import (
	"os"

	"golang.org/x/sys/unix"
)

// startWriteback asks the kernel to start writing a finished range to disk without waiting,
// so that dirty pages do not pile up until the final fsync, which then has little left to do.
func startWriteback(f *os.File, off, n int64) {
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	// Errors are ignored: this is only a hint, and Commit's fsync is what makes data durable.
	// Control keeps the descriptor open for the call, even if Abort closes the file meanwhile.
	_ = rc.Control(func(fd uintptr) {
		_ = unix.SyncFileRange(int(fd), off, n, unix.SYNC_FILE_RANGE_WRITE)
	})
}
