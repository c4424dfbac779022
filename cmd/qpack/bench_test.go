package main

import (
	"regexp"
	"strconv"
	"testing"
)

func TestBenchRead(t *testing.T) {
	out, err := run(t, "bench", "read", "--workers", "2", "../../testdata/models/tiny")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?m)^(tensors \(2 workers, as convert reads\)|files \(sequential reads, like cat\)): +(\d+) bytes in [0-9.]+s = [0-9.]+ GB/s$`)
	m := re.FindAllStringSubmatch(out, -1)
	if len(m) != 2 {
		t.Fatalf("bench read printed:\n%s", out)
	}
	tensorBytes, _ := strconv.Atoi(m[0][2])
	fileBytes, _ := strconv.Atoi(m[1][2])
	if tensorBytes <= 0 || fileBytes <= tensorBytes {
		t.Errorf("tensors %d bytes, files %d bytes: the files hold the tensors and a header", tensorBytes, fileBytes)
	}
	for _, args := range [][]string{{"bench", "read"}, {"bench", "write", "../../testdata/models/tiny"}, {"bench", "read", "/does/not/exist"}, {"bench", "read", "--workers", "0", "../../testdata/models/tiny"}} {
		if _, err := run(t, args...); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}
