package npy

import "testing"

func TestReadSharedFixtures(t *testing.T) {
	ids, err := ReadFile("../testdata/models/tiny/heldout_ids.npy")
	if err != nil {
		t.Fatal(err)
	}
	v, err := ids.Ints()
	if err != nil {
		t.Fatal(err)
	}
	if len(v) != 64*512 || ids.Len() != 32768 {
		t.Fatalf("got %d ids, shape %v", len(v), ids.Shape)
	}
	for i, id := range v {
		if id < 0 || id >= 2048 {
			t.Fatalf("id %d at %d outside the tiny vocabulary", id, i)
		}
	}
	logits, err := ReadFile("../testdata/models/tiny/probe_logits.npy")
	if err != nil {
		t.Fatal(err)
	}
	if len(logits.Shape) != 2 || logits.Shape[0] != 64 || logits.Shape[1] != 2048 {
		t.Fatalf("probe logits shape %v", logits.Shape)
	}
	if _, err := logits.Ints(); err == nil {
		t.Errorf("Ints on a float array should fail")
	}
}

func TestDecodeRejectsBadInput(t *testing.T) {
	header := "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }      \n"
	good := append([]byte("\x93NUMPY\x01\x00"), byte(len(header)), 0)
	good = append(append(good, header...), 1, 0, 0, 0, 2, 0, 0, 0)
	a, err := Decode(good)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := a.Ints(); len(v) != 2 || v[0] != 1 || v[1] != 2 {
		t.Fatalf("got %v", v)
	}
	for name, b := range map[string][]byte{
		"magic":     []byte("NOTNPY\x01\x00\x00\x00"),
		"truncated": good[:len(good)-3],
		"header":    good[:20],
		"bigendian": []byte(string(good[:10]) + "{'descr': '>i4', 'fortran_order': False, 'shape': (2,), }      \n"),
	} {
		if _, err := Decode(b); err == nil {
			t.Errorf("%s: expected an error", name)
		}
	}
}

func TestEncodeInt32sRoundTrip(t *testing.T) {
	want := []int{0, 7, -3, 31999, 1 << 30}
	v := make([]int32, len(want))
	for i, x := range want {
		v[i] = int32(x)
	}
	b := EncodeInt32s(v)
	if off := 10 + (int(b[8]) | int(b[9])<<8); off%64 != 0 {
		t.Errorf("data starts at byte %d, not a multiple of 64", off)
	}
	a, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	got, err := a.Ints()
	if err != nil || a.DType != "i4" || len(a.Shape) != 1 || a.Shape[0] != len(want) {
		t.Fatalf("decoded %+v, %v", a, err)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("element %d: %d, want %d", i, got[i], want[i])
		}
	}
}
