package cuda

import (
	"errors"
	"fmt"
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
	switch choice {
	case ChoiceCPU:
		return nil, "", nil
	case ChoiceAuto, ChoiceCUDA, "":
	default:
		return nil, "", fmt.Errorf("device %q: want auto, cpu or cuda", choice)
	}
	dev, err = Open(0)
	if err == nil {
		return dev, "", nil
	}
	if choice == ChoiceCUDA {
		return nil, "", fmt.Errorf("--device cuda: %w", err)
	}
	if errors.Is(err, ErrNoDriver) || errors.Is(err, ErrNoGPU) {
		return nil, "", nil
	}
	return nil, fmt.Sprintf("GPU unavailable, running on the CPU: %v", err), nil
}
