package cuda

import (
	"fmt"
	"unsafe"

	"github.com/qpack-dev/qpack/internal/timeline"
)

// Solver is a cuSOLVER dense handle bound to one device, with the workspaces its calls need
// (grown on demand, freed by Close). Matrices are column-major. Each call enqueues its work on
// the handle's stream and writes LAPACK's info (0: success; i > 0: the order-i minor is not
// positive definite, or the i-th diagonal entry is zero) as an int32 at a device address the
// caller reads after synchronizing. Not safe for concurrent use.
type Solver struct {
	d      *Device
	h      uintptr
	params uintptr
	work   DevicePtr // device workspace
	size   int
	host   []byte // pinned host workspace

	destroy   func(h uintptr) int32
	createP   func(p *uintptr) int32
	destroyP  func(p uintptr) int32
	setStream func(h, s uintptr) int32
	potrfSize func(h, p uintptr, uplo int32, n int64, dt int32, a uintptr, lda int64, ct int32, dev, host *uint64) int32
	potrf     func(h, p uintptr, uplo int32, n int64, dt int32, a uintptr, lda int64, ct int32, dev uintptr, devBytes uint64, host unsafe.Pointer, hostBytes uint64, info uintptr) int32
	create    func(h *uintptr) int32
}

// NewSolver loads cuSOLVER (see FindLibraries) and creates a handle on d.
func (d *Device) NewSolver() (*Solver, error) {
	defer timeline.Begin(d.Info().Ordinal, "cuSOLVER handle")()
	lib, err := mathLibrary("cusolver")
	if err != nil {
		return nil, err
	}
	s := &Solver{d: d}
	if err := bindFunctions(lib, map[string]any{
		"cusolverDnCreate": &s.create, "cusolverDnDestroy": &s.destroy,
		"cusolverDnCreateParams": &s.createP, "cusolverDnDestroyParams": &s.destroyP,
		"cusolverDnSetStream":         &s.setStream,
		"cusolverDnXpotrf_bufferSize": &s.potrfSize, "cusolverDnXpotrf": &s.potrf,
	}); err != nil {
		return nil, err
	}
	err = d.do(func() error {
		if err := solverCheck("cusolverDnCreate", s.create(&s.h)); err != nil {
			return err
		}
		if err := solverCheck("cusolverDnCreateParams", s.createP(&s.params)); err != nil {
			s.destroy(s.h)
			return err
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

func solverCheck(call string, status int32) error {
	if status == 0 {
		return nil
	}
	return fmt.Errorf("cuda: %s failed with cuSOLVER status %d", call, status)
}

// SetStream makes later calls run on stream st.
func (s *Solver) SetStream(st Stream) error {
	return s.d.do(func() error { return solverCheck("cusolverDnSetStream", s.setStream(s.h, uintptr(st))) })
}

// Close frees the workspaces and destroys the handle.
func (s *Solver) Close() error {
	var first error
	keep := func(err error) {
		if first == nil {
			first = err
		}
	}
	if s.size > 0 {
		keep(s.d.Free(s.work))
		s.size = 0
	}
	if s.host != nil {
		keep(s.d.FreeHost(s.host))
		s.host = nil
	}
	keep(s.d.do(func() error {
		err := solverCheck("cusolverDnDestroyParams", s.destroyP(s.params))
		if e := solverCheck("cusolverDnDestroy", s.destroy(s.h)); err == nil {
			err = e
		}
		return err
	}))
	return first
}

// reserve grows the workspaces to dev and host bytes. Growing the device workspace
// synchronizes the device (a queued call may still use the old one).
func (s *Solver) reserve(dev, host uint64) error {
	if int(dev) > s.size {
		if s.size > 0 {
			if err := s.d.Synchronize(); err != nil {
				return err
			}
			if err := s.d.Free(s.work); err != nil {
				return err
			}
			s.size = 0
		}
		p, err := s.d.Alloc(int(dev))
		if err != nil {
			return fmt.Errorf("cuSOLVER workspace: %w", err)
		}
		s.work, s.size = p, int(dev)
	}
	if int(host) > len(s.host) {
		if s.host != nil {
			if err := s.d.Synchronize(); err != nil {
				return err
			}
			if err := s.d.FreeHost(s.host); err != nil {
				return err
			}
			s.host = nil
		}
		b, err := s.d.AllocHost(int(host))
		if err != nil {
			return fmt.Errorf("cuSOLVER host workspace: %w", err)
		}
		s.host = b
	}
	return nil
}

func (s *Solver) hostWork() (unsafe.Pointer, uint64) {
	if len(s.host) == 0 {
		return nil, 0
	}
	return unsafe.Pointer(&s.host[0]), uint64(len(s.host))
}

func squareArgs(n, lda int, dt DataType) error {
	if n <= 0 || lda < n {
		return fmt.Errorf("cuda: matrix order %d with leading dimension %d", n, lda)
	}
	if dt != Float32 && dt != Float64 {
		return fmt.Errorf("cuda: unsupported data type %d", dt)
	}
	return nil
}

// Potrf enqueues the Cholesky factorisation of the symmetric positive definite n×n matrix a
// (uplo's triangle is read and overwritten with L, A = L·Lᵀ, or U, A = Uᵀ·U), element type dt.
func (s *Solver) Potrf(uplo Fill, n int, dt DataType, a DevicePtr, lda int, info DevicePtr) error {
	if err := squareArgs(n, lda, dt); err != nil {
		return err
	}
	var dev, host uint64
	err := s.d.do(func() error {
		return solverCheck("cusolverDnXpotrf_bufferSize", s.potrfSize(s.h, s.params, int32(uplo), int64(n), int32(dt),
			uintptr(a), int64(lda), int32(dt), &dev, &host))
	})
	if err == nil {
		err = s.reserve(max(dev, 1), host)
	}
	if err != nil {
		return err
	}
	return s.d.do(func() error {
		hp, hb := s.hostWork()
		return solverCheck("cusolverDnXpotrf", s.potrf(s.h, s.params, int32(uplo), int64(n), int32(dt), uintptr(a), int64(lda),
			int32(dt), uintptr(s.work), uint64(s.size), hp, hb, uintptr(info)))
	})
}
