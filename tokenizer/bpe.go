package tokenizer

import (
	"container/heap"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
)

// bpe is the byte-pair-encoding model: a word starts as one symbol per character and the
// lowest-ranked adjacent pair is merged until no pair has a merge rule.
type bpe struct {
	vocab        map[string]int
	merges       map[symbolPair]mergeRule
	unkID        int // -1 when the model has no unk token
	fuseUnk      bool
	byteFallback bool
	ignoreMerges bool
	prefix       string // continuing_subword_prefix, put before every character but the first
	suffix       string // end_of_word_suffix, put after the last character

	mu    sync.RWMutex
	cache map[string][]int // results per pre-token word
}

type symbolPair struct{ left, right int }

type mergeRule struct{ rank, id int }

const (
	maxCachedWordBytes = 256
	maxCacheEntries    = 1 << 18
)

type bpeJSON struct {
	Type                    string            `json:"type"`
	Dropout                 *float64          `json:"dropout"`
	UnkToken                *string           `json:"unk_token"`
	ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
	FuseUnk                 bool              `json:"fuse_unk"`
	ByteFallback            bool              `json:"byte_fallback"`
	IgnoreMerges            bool              `json:"ignore_merges"`
	Vocab                   map[string]int    `json:"vocab"`
	Merges                  []json.RawMessage `json:"merges"`
}

func parseModel(raw json.RawMessage) (*bpe, error) {
	var c bpeJSON
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	if c.Type != "BPE" && !(c.Type == "" && c.Merges != nil) {
		return nil, fmt.Errorf("unsupported model type %q (only BPE is implemented)", c.Type)
	}
	if c.Dropout != nil && *c.Dropout > 0 {
		return nil, fmt.Errorf("model BPE: dropout %g makes encoding random; unsupported", *c.Dropout)
	}
	m := &bpe{
		vocab:        c.Vocab,
		unkID:        -1,
		fuseUnk:      c.FuseUnk,
		byteFallback: c.ByteFallback,
		ignoreMerges: c.IgnoreMerges,
		cache:        map[string][]int{},
	}
	if c.ContinuingSubwordPrefix != nil {
		m.prefix = *c.ContinuingSubwordPrefix
	}
	if c.EndOfWordSuffix != nil {
		m.suffix = *c.EndOfWordSuffix
	}
	if c.UnkToken != nil {
		id, ok := m.vocab[*c.UnkToken]
		if !ok {
			return nil, fmt.Errorf("model BPE: unk_token %q is not in the vocab", *c.UnkToken)
		}
		m.unkID = id
	}
	merges, err := m.parseMerges(c.Merges)
	if err != nil {
		return nil, err
	}
	m.merges = merges
	return m, nil
}

// parseMerges reads merges written either as "left right" strings or as ["left", "right"] pairs.
// A merge's rank is its position; its result is left+right (right without its subword prefix).
func (m *bpe) parseMerges(raw []json.RawMessage) (map[symbolPair]mergeRule, error) {
	merges := make(map[symbolPair]mergeRule, len(raw))
	for rank, r := range raw {
		left, right, err := parseMerge(r)
		if err != nil {
			return nil, fmt.Errorf("model BPE: merge %d: %w", rank, err)
		}
		result := left + strings.TrimPrefix(right, m.prefix)
		ids := [3]int{}
		for i, tok := range [3]string{left, right, result} {
			id, ok := m.vocab[tok]
			if !ok {
				return nil, fmt.Errorf("model BPE: merge %d (%q %q): token %q is not in the vocab", rank, left, right, tok)
			}
			ids[i] = id
		}
		merges[symbolPair{ids[0], ids[1]}] = mergeRule{rank: rank, id: ids[2]}
	}
	return merges, nil
}

func parseMerge(raw json.RawMessage) (string, string, error) {
	var line string
	if err := json.Unmarshal(raw, &line); err == nil {
		parts := strings.Split(line, " ")
		if len(parts) != 2 {
			return "", "", fmt.Errorf("%q is not two tokens separated by one space", line)
		}
		return parts[0], parts[1], nil
	}
	var pair []string
	if err := json.Unmarshal(raw, &pair); err != nil || len(pair) != 2 {
		return "", "", fmt.Errorf("%s is neither \"a b\" nor [\"a\", \"b\"]", raw)
	}
	return pair[0], pair[1], nil
}

// tokenize returns the ids of one pre-token, from the cache when it was seen before.
func (m *bpe) tokenize(word string) []int {
	if word == "" {
		return nil
	}
	if m.ignoreMerges {
		if id, ok := m.vocab[word]; ok {
			return []int{id}
		}
	}
	m.mu.RLock()
	ids, ok := m.cache[word]
	m.mu.RUnlock()
	if ok {
		return ids
	}
	ids = m.mergeWord(m.initialSymbols(word))
	if len(word) <= maxCachedWordBytes {
		m.mu.Lock()
		if len(m.cache) >= maxCacheEntries {
			clear(m.cache)
		}
		m.cache[word] = ids
		m.mu.Unlock()
	}
	return ids
}

// initialSymbols gives one id per character; a character outside the vocab becomes its
// "<0xNN>" byte tokens (byte_fallback), else the unk token (fused when fuse_unk), else nothing.
func (m *bpe) initialSymbols(word string) []int {
	ids := make([]int, 0, len(word))
	pendingUnk := false
	for i, r := range word {
		s := string(r)
		if i > 0 {
			s = m.prefix + s
		}
		if i+len(string(r)) == len(word) {
			s += m.suffix
		}
		if id, ok := m.vocab[s]; ok {
			if pendingUnk {
				ids, pendingUnk = append(ids, m.unkID), false
			}
			ids = append(ids, id)
			continue
		}
		if bytes, ok := m.byteTokens(s); ok {
			ids = append(ids, bytes...)
			continue
		}
		if m.unkID >= 0 {
			if pendingUnk && !m.fuseUnk {
				ids = append(ids, m.unkID)
			}
			pendingUnk = true
		}
	}
	if pendingUnk {
		ids = append(ids, m.unkID)
	}
	return ids
}

func (m *bpe) byteTokens(s string) ([]int, bool) {
	if !m.byteFallback {
		return nil, false
	}
	ids := make([]int, len(s))
	for i := 0; i < len(s); i++ {
		id, ok := m.vocab[fmt.Sprintf("<0x%02X>", s[i])]
		if !ok {
			return nil, false
		}
		ids[i] = id
	}
	return ids, true
}

// mergeWord applies merges in order of rank (ties: leftmost first) to a list of symbols, kept
// as a linked list so that each merge is O(log n).
func (m *bpe) mergeWord(ids []int) []int {
	n := len(ids)
	prev := make([]int, n)
	next := make([]int, n)
	alive := make([]bool, n)
	for i := range ids {
		prev[i], next[i], alive[i] = i-1, i+1, true
	}
	queue := &mergeQueue{}
	push := func(pos int) {
		if pos < 0 || next[pos] >= n {
			return
		}
		if rule, ok := m.merges[symbolPair{ids[pos], ids[next[pos]]}]; ok {
			heap.Push(queue, pendingMerge{rule.rank, pos, rule.id})
		}
	}
	for i := 0; i+1 < n; i++ {
		push(i)
	}
	for queue.Len() > 0 {
		top := heap.Pop(queue).(pendingMerge)
		right := next[top.pos]
		if !alive[top.pos] || right >= n {
			continue
		}
		// The pair may have changed since it was queued; merge only if it still yields top.id.
		if rule, ok := m.merges[symbolPair{ids[top.pos], ids[right]}]; !ok || rule.id != top.id {
			continue
		}
		ids[top.pos] = top.id
		alive[right] = false
		next[top.pos] = next[right]
		if next[right] < n {
			prev[next[right]] = top.pos
		}
		push(prev[top.pos])
		push(top.pos)
	}
	out := make([]int, 0, n)
	for i := 0; i < n; i = next[i] {
		out = append(out, ids[i])
	}
	return out
}

type pendingMerge struct{ rank, pos, id int }

// mergeQueue is a min-heap on (rank, position).
type mergeQueue []pendingMerge

func (q mergeQueue) Len() int { return len(q) }
func (q mergeQueue) Less(i, j int) bool {
	if q[i].rank != q[j].rank {
		return q[i].rank < q[j].rank
	}
	return q[i].pos < q[j].pos
}
func (q mergeQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *mergeQueue) Push(x any)   { *q = append(*q, x.(pendingMerge)) }
func (q *mergeQueue) Pop() any {
	old := *q
	x := old[len(old)-1]
	*q = old[:len(old)-1]
	return x
}
