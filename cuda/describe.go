package cuda

import (
	"fmt"
	"strings"
)

// Report is what `qpack doctor` prints about the GPU side of this machine.
type Report struct {
	Driver        string // soname of the driver library that loaded
	DriverVersion int    // CUDA version the driver supports, e.g. 13000
	DriverErr     error  // why there is no usable driver; nil when there is one
	GPUs          []DeviceInfo
	Libraries     []Library
}

// Describe reports the driver, the GPUs and the math libraries. It never fails: what is missing
// is recorded in the report.
func Describe() Report {
	var r Report
	drv, err := loadedDriver()
	if err == nil {
		r.Driver = drv.name
		if r.DriverVersion, err = DriverVersion(); err == nil {
			r.GPUs, err = Devices()
		}
	}
	r.DriverErr = err
	r.Libraries = FindLibraries()
	return r
}

func (r Report) String() string {
	var b strings.Builder
	if r.DriverErr != nil {
		fmt.Fprintf(&b, "driver: not usable, qpack runs on the CPU (%v)\n", r.DriverErr)
	} else {
		fmt.Fprintf(&b, "driver: %s, CUDA %d.%d\n", r.Driver, r.DriverVersion/1000, r.DriverVersion%1000/10)
		if len(r.GPUs) == 0 {
			b.WriteString("GPUs: none\n")
		}
		for _, g := range r.GPUs {
			fmt.Fprintf(&b, "%s\n", g)
		}
	}
	for _, l := range r.Libraries {
		fmt.Fprintf(&b, "%s\n", l)
	}
	return b.String()
}
