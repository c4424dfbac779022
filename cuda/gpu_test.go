package cuda

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/qpack-dev/qpack/fp"
)

// openTestDevice opens GPU 0, skipping the test on a machine without driver or GPU.
func openTestDevice(tb testing.TB) *Device {
	tb.Helper()
	gpus, err := Devices()
	if errors.Is(err, ErrNoDriver) {
		tb.Skip("no NVIDIA driver: ", err)
	}
	if errors.Is(err, ErrNoGPU) {
		tb.Skip("driver present but no GPU: ", err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	if len(gpus) == 0 {
		tb.Skip("driver present but no GPU")
	}
	d, err := Open(0)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := d.Close(); err != nil {
			tb.Error(err)
		}
	})
	return d
}

func randomBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func TestDescribeOnGPU(t *testing.T) {
	openTestDevice(t)
	r := Describe()
	t.Logf("\n%s", r)
	if r.DriverErr != nil || r.DriverVersion < 11000 || len(r.GPUs) == 0 {
		t.Fatalf("bad report: %+v", r)
	}
	for _, g := range r.GPUs {
		if g.TotalMemory == 0 || g.ComputeMajor < 5 || g.Multiprocessors == 0 || g.Name == "" {
			t.Errorf("implausible device info %+v", g)
		}
	}
}

func TestMemoryRoundTrip(t *testing.T) {
	d := openTestDevice(t)
	free, total, err := d.MemoryInfo()
	if err != nil || free == 0 || free > total {
		t.Fatalf("MemoryInfo: free %d total %d err %v", free, total, err)
	}
	r := rand.New(rand.NewPCG(1, uint64(total)))
	const n = 1_000_003
	src := randomBytes(r, n)
	a, err := d.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(a)
	b, err := d.Alloc(n + 64)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(b)
	if err := d.Fill32(b, 0xdeadbeef, (n+64)/4); err != nil {
		t.Fatal(err)
	}
	if err := d.CopyToDevice(a, src); err != nil {
		t.Fatal(err)
	}
	if err := d.CopyDevice(b.Add(3), a, n); err != nil { // odd offset
		t.Fatal(err)
	}
	got := make([]byte, n+6)
	if err := d.CopyFromDevice(got, b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[3:3+n], src) {
		t.Fatal("bytes changed in H2D → D2D → D2H")
	}
	poison := []byte{0xef, 0xbe, 0xad, 0xde} // 0xdeadbeef, little-endian
	for _, j := range []int{0, 1, 2, n + 3, n + 4, n + 5} {
		if got[j] != poison[j%4] {
			t.Errorf("byte %d outside the copy was changed to %#x", j, got[j])
		}
	}
}

func TestAsyncCopiesWithPinnedMemory(t *testing.T) {
	d := openTestDevice(t)
	r := rand.New(rand.NewPCG(2, 3))
	const n = 3<<20 + 5
	in, err := d.AllocHost(n)
	if err != nil {
		t.Fatal(err)
	}
	defer d.FreeHost(in)
	out, err := d.AllocHost(n)
	if err != nil {
		t.Fatal(err)
	}
	defer d.FreeHost(out)
	copy(in, randomBytes(r, n))
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer d.DestroyStream(s)
	a, _ := d.Alloc(n)
	defer d.Free(a)
	b, _ := d.Alloc(n)
	defer d.Free(b)
	for _, err := range []error{
		d.CopyToDeviceAsync(a, in, s),
		d.CopyDeviceAsync(b, a, n, s),
		d.CopyFromDeviceAsync(out, b, s),
		d.SynchronizeStream(s),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(in, out) {
		t.Fatal("async round trip changed the bytes")
	}
	if err := d.CopyToDeviceAsync(a, make([]byte, 16), s); err == nil {
		t.Error("async copy from unpinned Go memory accepted")
	}
	if err := d.FreeHost(in[1:]); err == nil {
		t.Error("FreeHost of a slice not starting an allocation accepted")
	}
}

// probePTX stores its scalar parameters so that the launch-parameter marshalling can be checked
// without nvcc. Hand-written; PTX ISA 7.0 runs on sm_80 and newer.
const probePTX = `.version 7.0
.target sm_80
.address_size 64
.visible .entry probe(.param .u64 out, .param .u32 a, .param .u64 b, .param .f32 c, .param .f64 e)
{
	.reg .b32 %r<2>;
	.reg .b64 %rd<4>;
	.reg .f32 %f<2>;
	.reg .f64 %fd<2>;
	ld.param.u64 %rd1, [out];
	cvta.to.global.u64 %rd2, %rd1;
	ld.param.u32 %r1, [a];
	ld.param.u64 %rd3, [b];
	ld.param.f32 %f1, [c];
	ld.param.f64 %fd1, [e];
	st.global.u32 [%rd2], %r1;
	st.global.u64 [%rd2+8], %rd3;
	st.global.f32 [%rd2+16], %f1;
	st.global.f64 [%rd2+24], %fd1;
	ret;
}
`

func TestLaunchPassesParameters(t *testing.T) {
	d := openTestDevice(t)
	m, err := d.LoadModule([]byte(probePTX))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Unload()
	fn, err := m.Function("probe")
	if err != nil {
		t.Fatal(err)
	}
	out, _ := d.Alloc(32)
	defer d.Free(out)
	d.Fill32(out, 0xdeadbeef, 8)
	if err := fn.Launch(Dim3{1, 1, 1}, Dim3{1, 1, 1}, 0, 0, out, int32(-7), uint64(1<<40+3), float32(-1.25), math.Pi); err != nil {
		t.Fatal(err)
	}
	if err := d.Synchronize(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 32)
	d.CopyFromDevice(got, out)
	le := func(b []byte) uint64 {
		var v uint64
		for i := len(b) - 1; i >= 0; i-- {
			v = v<<8 | uint64(b[i])
		}
		return v
	}
	if v := int32(le(got[0:4])); v != -7 {
		t.Errorf("int32 param arrived as %d", v)
	}
	if v := le(got[8:16]); v != 1<<40+3 {
		t.Errorf("uint64 param arrived as %d", v)
	}
	if v := math.Float32frombits(uint32(le(got[16:20]))); v != -1.25 {
		t.Errorf("float32 param arrived as %g", v)
	}
	if v := math.Float64frombits(le(got[24:32])); v != math.Pi {
		t.Errorf("float64 param arrived as %g", v)
	}
	if _, err := m.Function("no_such_kernel"); err == nil {
		t.Error("lookup of a missing kernel succeeded")
	}
	if _, err := d.LoadModule([]byte(".version 7.0\n.target sm_80\nthis is not ptx\n")); err == nil {
		t.Error("garbage PTX loaded")
	} else {
		t.Log("bad PTX: ", err)
	}
	if err := fn.Launch(Dim3{0, 1, 1}, Dim3{1, 1, 1}, 0, 0, out, int32(0), uint64(0), float32(0), 0.0); err == nil {
		t.Error("empty grid accepted")
	}
}

// ConvertToF32Checked finds the first NaN or infinity of an F16 or BF16 source, plus base, on the
// vector and the scalar kernels, wherever it is (two planted, the later one not reported), and
// nothing in finite values, whose exponents come up to one below all ones.
func TestConvertCheckedFindsFirstNonFinite(t *testing.T) {
	d := openTestDevice(t)
	r := rand.New(rand.NewPCG(6, 7))
	exponent := map[DType]uint16{F16: 0x7c00, BF16: 0x7f80}
	for _, typ := range []DType{F16, BF16} {
		for _, n := range []int{1, 9, 4097, 1<<20 + 3} {
			for _, off := range []int{0, 1} { // aligned (vector kernel), misaligned (scalar)
				vals := make([]uint16, n)
				for i := range vals {
					vals[i] = uint16(r.Uint32())
					if vals[i]&exponent[typ] == exponent[typ] {
						vals[i] &^= exponent[typ] & -exponent[typ] // the exponent's lowest bit cleared: finite
					}
				}
				first := -1
				if n > 1 {
					a, b := r.IntN(n), r.IntN(n)
					vals[a] |= exponent[typ] // NaN or ±Inf
					vals[b] |= exponent[typ]
					first = min(a, b)
				}
				src, _ := d.Alloc(2*n + 16)
				dst, _ := d.Alloc(4*n + 64)
				word, _ := d.Alloc(8)
				d.CopyToDevice(src.Add(2*off), Bytes(vals))
				d.Fill32(word, math.MaxUint32, 2)
				const base = 1000
				if err := d.ConvertToF32Checked(dst.Add(4*off), src.Add(2*off), typ, n, word, base, 0); err != nil {
					t.Fatal(err)
				}
				var got [1]uint64
				if err := d.CopyFromDevice(Bytes(got[:]), word); err != nil {
					t.Fatal(err)
				}
				d.Free(src)
				d.Free(dst)
				d.Free(word)
				want := uint64(math.MaxUint64)
				if first >= 0 {
					want = base + uint64(first)
				}
				if got[0] != want {
					t.Errorf("%s n=%d offset %d: first non-finite %d, want %d", typ, n, off, got[0], want)
				}
			}
		}
	}
}

func TestConvertMatchesReference(t *testing.T) {
	d := openTestDevice(t)
	r := rand.New(rand.NewPCG(4, 5))
	const poison = 0x7fbadbad // a NaN neither conversion can produce (their low 13 bits are 0)
	ref := map[DType]func(uint16) float32{F16: fp.F16ToF32, BF16: fp.BF16ToF32}
	for _, typ := range []DType{F16, BF16, F32} {
		for _, n := range []int{1, 7, 8, 9, 1023, 4097, 1<<20 + 3} {
			// Offsets in elements: aligned (vector kernel), misaligned source or destination (scalar kernel).
			for _, off := range [][2]int{{0, 0}, {1, 0}, {0, 1}} {
				srcOff, dstOff := off[0]*typ.Size(), off[1]*4
				raw := randomBytes(r, n*typ.Size())
				src, _ := d.Alloc(len(raw) + 16)
				dst, _ := d.Alloc(4*n + 64 + 4)
				d.CopyToDevice(src.Add(srcOff), raw)
				d.Fill32(dst, poison, n+17)
				if err := d.ConvertToF32(dst.Add(dstOff), src.Add(srcOff), typ, n, 0); err != nil {
					t.Fatal(err)
				}
				if err := d.Synchronize(); err != nil {
					t.Fatal(err)
				}
				words := make([]uint32, n+16+1)
				d.CopyFromDevice(Bytes(words), dst)
				d.Free(src)
				d.Free(dst)
				out := words[off[1]:]
				for i := range n {
					var want float32
					if typ == F32 {
						want = math.Float32frombits(uint32(raw[4*i]) | uint32(raw[4*i+1])<<8 | uint32(raw[4*i+2])<<16 | uint32(raw[4*i+3])<<24)
					} else {
						want = ref[typ](uint16(raw[2*i]) | uint16(raw[2*i+1])<<8)
					}
					got := math.Float32frombits(out[i])
					same := out[i] == math.Float32bits(want) || (got != got && want != want)
					if out[i] == poison || !same {
						t.Fatalf("%s n=%d offsets %v: element %d is %#x, want %#x", typ, n, off, i, out[i], math.Float32bits(want))
					}
				}
				for i := n; i < n+16; i++ {
					if out[i] != poison {
						t.Fatalf("%s n=%d offsets %v: element %d past the end was written", typ, n, off, i)
					}
				}
			}
		}
	}
}

func TestConcurrentUseFromManyGoroutines(t *testing.T) {
	d := openTestDevice(t)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 16 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 9))
			data := randomBytes(r, 4096+g)
			p, err := d.Alloc(len(data))
			if err != nil {
				errs <- err
				return
			}
			defer d.Free(p)
			back := make([]byte, len(data))
			if err := d.CopyToDevice(p, data); err != nil {
				errs <- err
			} else if err := d.CopyFromDevice(back, p); err != nil {
				errs <- err
			} else if !bytes.Equal(back, data) {
				errs <- errors.New("data mixed up between goroutines")
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestClosedDeviceRefusesCalls(t *testing.T) {
	d := openTestDevice(t)
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Alloc(16); !errors.Is(err, ErrClosed) {
		t.Fatalf("Alloc after Close: %v, want ErrClosed", err)
	}
}

// openTestStager opens the GPU, a stager of 1000 bytes (halves of 500) and a stream, all
// released when the test ends.
func openTestStager(t *testing.T) (*Device, *Stager, Stream) {
	d := openTestDevice(t)
	st, err := d.NewStager(1000)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.DestroyStream(s) })
	return d, st, s
}

// TestStagerCopiesEveryPiece: copies larger than the pinned buffer (several pieces through
// both halves), smaller, and back to back, all arrive intact.
func TestStagerCopiesEveryPiece(t *testing.T) {
	d, st, s := openTestStager(t)
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	for _, n := range []int{4321, 499, 500, 1, 1001} {
		src := randomBytes(r, n)
		want := bytes.Clone(src)
		p, err := d.Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.CopyToDevice(p, src, s); err != nil {
			t.Fatal(err)
		}
		clear(src[:n/2]) // the caller may reuse src at once
		if err := d.SynchronizeStream(s); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, n)
		if err := d.CopyFromDevice(got, p); err != nil {
			t.Fatal(err)
		}
		d.Free(p)
		if !bytes.Equal(got, want) {
			t.Errorf("%d bytes: the device copy differs", n)
		}
	}
}

// TestStagerDownloadsInStreamOrder: downloads through the stager (several pieces through both
// halves, smaller, exactly one half) see the work queued before them on their stream — an
// upload, then an asynchronous fill of part of it — and nothing else, and interleave with
// uploads through the same halves.
func TestStagerDownloadsInStreamOrder(t *testing.T) {
	d, st, s := openTestStager(t)
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 2))
	for _, n := range []int{4324, 500, 4, 1004, 2000} {
		src := randomBytes(r, n)
		want := bytes.Clone(src)
		for i := 4 * (n / 16); i < 4*(n/8); i++ { // the fill: words [n/16, n/8)
			want[i] = 0xab
		}
		p, err := d.Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.CopyToDevice(p, src, s); err != nil {
			t.Fatal(err)
		}
		if err := d.Fill32Async(p.Add(4*(n/16)), 0xabababab, n/8-n/16, s); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, n)
		for i := range got {
			got[i] = byte(i) // not what the device holds
		}
		if err := st.CopyFromDevice(got, p, s); err != nil {
			t.Fatal(err)
		}
		d.Free(p)
		if !bytes.Equal(got, want) {
			t.Errorf("%d bytes: the download differs from the upload with its fill", n)
		}
	}
}
