package onnx

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/qpack-dev/qpack/internal/testenv"
	"github.com/qpack-dev/qpack/model"
	"github.com/qpack-dev/qpack/npy"
)

// ortVersion is the onnxruntime-node release the tests run the exports in (docs/reference/onnx.md §4.1: its
// npm tarball carries the CPU runtime; MatMulNBits 2/4/8 bits and DQ-25 int2 need ≥ 1.24).
const ortVersion = "1.30.0"

var (
	ortOnce sync.Once
	ortDir  string // a node_modules directory holding onnxruntime-node
	ortWhy  string // why it is not available
)

// ortModules finds onnxruntime-node: $QPACK_ORT_NODE_MODULES, else qpack's user cache, which it
// fills with npm (install scripts skipped: they fetch GPU libraries) when npm and the registry
// are reachable. Without it the test is skipped with the reason.
func ortModules(t *testing.T) string {
	t.Helper()
	ortOnce.Do(func() {
		if _, err := exec.LookPath("node"); err != nil {
			ortWhy = "node is not installed"
			return
		}
		if dir := os.Getenv("QPACK_ORT_NODE_MODULES"); dir != "" {
			ortDir = dir
			return
		}
		cache, err := os.UserCacheDir()
		if err != nil {
			ortWhy = err.Error()
			return
		}
		root := filepath.Join(cache, "qpack", "onnxruntime-node-"+ortVersion)
		mods := filepath.Join(root, "node_modules")
		if _, err := os.Stat(filepath.Join(mods, "onnxruntime-node", "package.json")); err == nil {
			ortDir = mods
			return
		}
		if _, err := exec.LookPath("npm"); err != nil {
			ortWhy = "npm is not installed to fetch onnxruntime-node"
			return
		}
		if err := os.MkdirAll(root, 0o755); err != nil {
			ortWhy = err.Error()
			return
		}
		os.WriteFile(filepath.Join(root, "package.json"), []byte(`{"name":"qpack-ort","private":true}`), 0o644)
		cmd := exec.Command("npm", "install", "--ignore-scripts", "--no-audit", "--no-fund", "onnxruntime-node@"+ortVersion)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			ortWhy = "npm install onnxruntime-node@" + ortVersion + " failed: " + err.Error() + "\n" + string(out)
			return
		}
		ortDir = mods
	})
	if ortDir == "" {
		t.Skipf("onnxruntime-node unavailable (%s); set QPACK_ORT_NODE_MODULES to a node_modules holding onnxruntime-node@%s", ortWhy, ortVersion)
	}
	return ortDir
}

// runORT runs testdata/ort.js on the exported model dir with the request and returns its output file.
func runORT(t *testing.T, dir string, req map[string]any) []byte {
	t.Helper()
	mods := ortModules(t)
	tmp := t.TempDir()
	reqFile, outFile := filepath.Join(tmp, "req.json"), filepath.Join(tmp, "out")
	b, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(reqFile, b, 0o644); err != nil {
		t.Fatal(err)
	}
	script, err := filepath.Abs(filepath.Join("testdata", "ort.js"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("node", script, dir, reqFile, outFile)
	cmd.Env = append(os.Environ(), "NODE_PATH="+mods)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("onnxruntime on %s: %v\n%s", dir, err, out)
	}
	out, err := os.ReadFile(outFile)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// ortLogits runs ids through the exported model and returns logits [len(ids), vocab]; with
// split > 0 followed by those of the ids run in two chunks joined by the KV cache.
func ortLogits(t *testing.T, dir string, ids []int, split int) []float32 {
	raw := runORT(t, dir, map[string]any{"mode": "logits", "ids": ids, "split": split})
	v := make([]float32, len(raw)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	return v
}

// ortPerplexity scores the sequences like model.Perplexity: no BOS, loss over positions 1..L−1.
func ortPerplexity(t *testing.T, dir string, seqs [][]int) float64 {
	var r struct {
		NLL    float64 `json:"nll"`
		Tokens int     `json:"tokens"`
	}
	if err := json.Unmarshal(runORT(t, dir, map[string]any{"mode": "nll", "seqs": seqs}), &r); err != nil {
		t.Fatal(err)
	}
	return math.Exp(r.NLL / float64(r.Tokens))
}

// heldout returns the first n held-out ids of a test model directory.
func heldout(t *testing.T, dir string, n int) []int {
	t.Helper()
	a, err := npy.ReadFile(filepath.Join(dir, "heldout_ids.npy"))
	if err != nil {
		t.Fatal(err)
	}
	ids, err := a.Ints()
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) < n {
		t.Fatalf("%s has %d held-out ids, want %d", dir, len(ids), n)
	}
	return ids[:n]
}

// relErr is max |got − want| / max |want|.
func relErr(t *testing.T, got, want []float32) float64 {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d logits, want %d", len(got), len(want))
	}
	var d, m float64
	for i := range want {
		if math.IsNaN(float64(got[i])) {
			t.Fatalf("logit %d is NaN", i)
		}
		d = max(d, math.Abs(float64(got[i]-want[i])))
		m = max(m, math.Abs(float64(want[i])))
	}
	return d / m
}

// qpackLogits is qpack's own CPU forward pass over ids on the checkpoint src.
func qpackLogits(t *testing.T, src string, ids []int) []float32 {
	t.Helper()
	m, err := model.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	logits, err := m.Logits(ids)
	if err != nil {
		t.Fatal(err)
	}
	return logits
}

// checkExport exports src with opt and checks the logits of ids against qpack's forward pass,
// in one pass and in two chunks through the KV cache.
func checkExport(t *testing.T, src string, ids []int, opt Options) (string, *Report) {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "onnx")
	r, err := Export(src, dst, opt)
	if err != nil {
		t.Fatal(err)
	}
	want := qpackLogits(t, src, ids)
	both := ortLogits(t, dst, ids, len(ids)/3)
	got, chunked := both[:len(both)/2], both[len(both)/2:]
	if e := relErr(t, got, want); e > 1e-3 {
		t.Errorf("logits differ from qpack's forward: max|Δ|/max|logit| = %.2e, want ≤ 1e-3", e)
	} else {
		t.Logf("logits: max|Δ|/max|logit| = %.2e (%v)", e, r.Linears)
	}
	if e := relErr(t, chunked, got); e > 1e-5 {
		t.Errorf("two chunks through the KV cache differ from one pass: %.2e", e)
	}
	return dst, r
}

func tinyDir(t *testing.T) string { return testenv.Testdata(t, "models/tiny") }

func TestExportTinyPlain(t *testing.T) {
	src := tinyDir(t)
	checkExport(t, src, heldout(t, src, 64), Options{})
}
