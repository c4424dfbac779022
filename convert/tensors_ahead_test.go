package convert

import (
	"fmt"
	"testing"

	"github.com/qpack-dev/qpack/model"
	"github.com/qpack-dev/qpack/quant"
)

// aheadBlock is a dense block of small linears named as block i's: q and o of one shape, k and v
// of another, gate and up of a third, down of a fourth.
func aheadBlock(i int) *model.Block {
	lin := func(name string, out, in int) *model.Linear {
		return &model.Linear{Name: fmt.Sprintf("model.layers.%d.%s", i, name), Out: out, In: in}
	}
	return &model.Block{Index: i,
		Q: lin("self_attn.q_proj", 64, 64), K: lin("self_attn.k_proj", 16, 64), V: lin("self_attn.v_proj", 16, 64),
		O: lin("self_attn.o_proj", 64, 64), Gate: lin("mlp.gate_proj", 96, 64), Up: lin("mlp.up_proj", 96, 64),
		Down: lin("mlp.down_proj", 64, 96)}
}

// pooled counts the tensors made (or being made) ahead.
func (a *tensorsAhead) pooled() int {
	n := 0
	for _, q := range a.made {
		n += len(q)
	}
	return n
}

func TestTensorsAheadMadeForTheNextBlock(t *testing.T) {
	int4, err := quant.ParseScheme("int4-g32")
	if err != nil {
		t.Fatal(err)
	}
	int8, err := quant.ParseScheme("int8-g32")
	if err != nil {
		t.Fatal(err)
	}
	every := func(*model.Linear) (quant.Scheme, bool) { return int4, true }
	a := &tensorsAhead{last: 2}
	check := func(what string, want int) {
		t.Helper()
		if got := a.pooled(); got != want {
			t.Fatalf("%s: %d tensors made ahead, want %d", what, got, want)
		}
	}
	takeAll := func(b *model.Block, g model.Group, s quant.Scheme) {
		t.Helper()
		for _, l := range b.Linears(g) {
			x := a.take(l, s)
			if x.Scheme != s || x.N != l.Out || x.K != l.In {
				t.Fatalf("%s: took a %v tensor of %d×%d", l.Name, x.Scheme, x.N, x.K)
			}
		}
	}
	// Block 0: its first Update makes all seven; each Update's groups are made again for block 1.
	b0 := aheadBlock(0)
	a.start(b0, every)
	check("block 0 started", 7)
	for _, g := range b0.Groups() {
		a.start(b0, every) // later Updates of the block make nothing more
		takeAll(b0, g, int4)
		a.next(b0, []model.Group{g}, every)
	}
	check("block 0 done", 7)
	// Block 1's first Update finds them all: nothing new is made, nothing dropped.
	b1 := aheadBlock(1)
	before := map[tensorKind][]chan *quant.Tensor{}
	for k, q := range a.made {
		before[k] = append([]chan *quant.Tensor(nil), q...)
	}
	a.start(b1, every)
	for k, q := range a.made {
		for i := range q {
			if q[i] != before[k][i] {
				t.Fatalf("block 1 started: a %d×%d tensor was made again", k.n, k.k)
			}
		}
	}
	check("block 1 started", 7)
	// Block 1 planned otherwise: its q/k/v at int8. Those kinds are made at start; the int4 k/v
	// made ahead, which block 1 takes none of, are dropped (q's int4 one serves o).
	qkv8 := func(l *model.Linear) (quant.Scheme, bool) {
		if b1.Linears(model.GroupQKV)[0] == l || b1.K == l || b1.V == l {
			return int8, true
		}
		return int4, true
	}
	a.block = -1 // as if the first Update had not counted
	a.start(b1, qkv8)
	check("block 1 replanned", 7)
	takeAll(b1, model.GroupQKV, int8)
	check("block 1's q/k/v taken", 4)
	// The last block's Updates make nothing for a block after it.
	b2 := aheadBlock(2)
	a.start(b2, every)
	for _, g := range b2.Groups() {
		takeAll(b2, g, int4)
		a.next(b2, []model.Group{g}, every)
	}
	check("last block done", 0)
	// A take with nothing made ahead makes its tensor.
	x := a.take(b2.Q, int8)
	if x.Scheme != int8 || x.N != 64 || x.K != 64 {
		t.Fatalf("made on take: a %v tensor of %d×%d", x.Scheme, x.N, x.K)
	}
}
