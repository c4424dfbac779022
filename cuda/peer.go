package cuda

import "fmt"

// codePeerAccessAlreadyEnabled is CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED: another Device of
// the same process (GPUs' primary contexts are shared) enabled it first.
const codePeerAccessAlreadyEnabled = 704

// EnablePeerAccess lets each of devs read and write the memory of the others directly, over
// NVLink or PCIe, wherever the driver says the pair can; it returns how many ordered pairs of
// distinct GPUs can (n·(n−1) when all can). Copies between devices work without it
// (CopyFromPeerAsync), staged through host memory by the driver.
func EnablePeerAccess(devs []*Device) (direct int, err error) {
	for _, a := range devs {
		for _, b := range devs {
			if a.dev == b.dev {
				continue
			}
			var can int32
			if err := a.drv.check("cuDeviceCanAccessPeer", a.drv.cuDeviceCanAccessPeer(&can, a.dev, b.dev)); err != nil {
				return direct, err
			}
			if can == 0 {
				continue
			}
			peer, err := b.context()
			if err != nil {
				return direct, err
			}
			err = a.do(func() error {
				r := a.drv.cuCtxEnablePeerAccess(peer, 0)
				if r == codePeerAccessAlreadyEnabled {
					return nil
				}
				return a.drv.check("cuCtxEnablePeerAccess", r)
			})
			if err != nil {
				return direct, fmt.Errorf("GPU %d to GPU %d: %w", a.info.Ordinal, b.info.Ordinal, err)
			}
			a.mu.Lock()
			if a.reaches == nil {
				a.reaches = map[int32]bool{}
			}
			a.reaches[b.dev] = true
			a.mu.Unlock()
			direct++
		}
	}
	return direct, nil
}

// Reaches says whether kernels running on d may read and write other's memory: other is the same
// GPU, or EnablePeerAccess enabled d's access to it.
func (d *Device) Reaches(other *Device) bool {
	if d.dev == other.dev {
		return true
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.reaches[other.dev]
}

// AllReach says whether every one of devs reaches every other's memory (Reaches).
func AllReach(devs []*Device) bool {
	for _, a := range devs {
		for _, b := range devs {
			if !a.Reaches(b) {
				return false
			}
		}
	}
	return true
}

// context returns the device's context, or ErrClosed.
func (d *Device) context() (uintptr, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.ctx == 0 {
		return 0, ErrClosed
	}
	return d.ctx, nil
}

// CopyFromPeerAsync enqueues on stream s of d a copy of bytes from src's memory at from into
// d's memory at to. src may be d itself, or another handle of the same GPU.
func (d *Device) CopyFromPeerAsync(to DevicePtr, src *Device, from DevicePtr, bytes int, s Stream) error {
	srcCtx, err := src.context()
	if err != nil {
		return err
	}
	return d.do(func() error {
		return d.drv.check("cuMemcpyPeerAsync", d.drv.cuMemcpyPeerAsync(uintptr(to), d.ctx, uintptr(from), srcCtx, uint64(bytes), uintptr(s)))
	})
}
