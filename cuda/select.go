package cuda

import (
	"errors"
	"fmt"

	"github.com/qpack-dev/qpack/internal/timeline"
	"golang.org/x/sync/errgroup"
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
	first := 0
	if len(ordinals) > 0 {
		first = ordinals[0]
	}
	end := timeline.Begin(timeline.Host, "driver and GPU %d's context", first)
	dev, err := Open(first)
	end()
	if err != nil {
		if choice == ChoiceCUDA {
			return nil, "", fmt.Errorf("--device cuda: %w", err)
		}
		if errors.Is(err, ErrNoDriver) || errors.Is(err, ErrNoGPU) {
			return nil, "", nil
		}
		return nil, fmt.Sprintf("GPU unavailable, running on the CPU: %v", err), nil
	}
	devs = []*Device{dev}
	if len(ordinals) == 0 {
		infos, err := Devices()
		if err != nil {
			dev.Close()
			return nil, "", err
		}
		for i := 1; i < len(infos); i++ {
			ordinals = append(ordinals, i)
		}
	} else {
		ordinals = ordinals[1:]
	}
	// The others' contexts are made at once: each takes a few hundred milliseconds of the driver.
	rest := make([]*Device, len(ordinals))
	var opening errgroup.Group
	for i, o := range ordinals {
		opening.Go(func() (err error) {
			defer timeline.Begin(o, "context")()
			if rest[i], err = Open(o); err != nil {
				return fmt.Errorf("GPU %d: %w", o, err)
			}
			return nil
		})
	}
	err = opening.Wait()
	devs = append(devs, rest...)
	if err != nil {
		for _, d := range devs {
			if d != nil {
				d.Close()
			}
		}
		return nil, "", err
	}
	return devs, "", nil
}
