package cuda

import (
	"errors"
	"fmt"
	"sync"

	"github.com/qpack-dev/qpack/internal/timeline"
)

// Device choices of the --device flags.
const (
	ChoiceAuto = "auto" // GPU 0 when a driver and a GPU are there, else the CPU
	ChoiceCPU  = "cpu"
	ChoiceCUDA = "cuda" // GPU 0 or an error
)

// Select opens the device a --device flag names. It returns nil for the CPU: for "cpu", and for
// "auto" when there is no usable GPU, with note saying why when the reason is not simply the
// absence of an NVIDIA driver or of a GPU. "cuda" without a usable GPU is an error.
func Select(choice string) (dev *Device, note string, err error) {
	devs, note, err := SelectMany(choice, []int{0})
	if len(devs) == 0 {
		return nil, note, err
	}
	return devs[0], note, err
}

// SelectMany is Select for several GPUs: the ordinals given, or every GPU the driver sees when
// ordinals is empty. Whether the CPU is chosen is decided by the first GPU as Select decides
// it; once that one opened, failing to open another is an error.
func SelectMany(choice string, ordinals []int) (devs []*Device, note string, err error) {
	switch choice {
	case ChoiceCPU:
		return nil, "", nil
	case ChoiceAuto, ChoiceCUDA, "":
	default:
		return nil, "", fmt.Errorf("device %q: want auto, cpu or cuda", choice)
	}
	end := timeline.Begin(timeline.Host, "driver")
	infos, err := Devices()
	end()
	if err == nil && len(infos) == 0 {
		err = fmt.Errorf("cuda: %w (the driver sees none)", ErrNoGPU)
	}
	if err != nil {
		return unavailable(choice, err)
	}
	if len(ordinals) == 0 {
		for _, info := range infos {
			ordinals = append(ordinals, info.Ordinal)
		}
	}
	// Every context is made at once, the first included: each takes a few hundred milliseconds
	// of the driver, and they overlap.
	devs = make([]*Device, len(ordinals))
	errs := make([]error, len(ordinals))
	var opening sync.WaitGroup
	for i, o := range ordinals {
		opening.Go(func() {
			defer timeline.Begin(o, "context")()
			devs[i], errs[i] = Open(o)
		})
	}
	opening.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, d := range devs {
			if d != nil {
				d.Close()
			}
		}
		if errs[0] != nil {
			return unavailable(choice, errs[0])
		}
		for i, e := range errs {
			if e != nil {
				return nil, "", fmt.Errorf("GPU %d: %w", ordinals[i], e)
			}
		}
	}
	return devs, "", nil
}

// unavailable is SelectMany's answer when the first GPU cannot be used (err says why): an
// error for "cuda"; for "auto", the CPU, with a note unless the reason is simply that there is
// no NVIDIA driver or no GPU.
func unavailable(choice string, err error) ([]*Device, string, error) {
	if choice == ChoiceCUDA {
		return nil, "", fmt.Errorf("--device cuda: %w", err)
	}
	if errors.Is(err, ErrNoDriver) || errors.Is(err, ErrNoGPU) {
		return nil, "", nil
	}
	return nil, fmt.Sprintf("GPU unavailable, running on the CPU: %v", err), nil
}
