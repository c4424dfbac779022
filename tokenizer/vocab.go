package tokenizer

import "sort"

// Vocab is the tokenizer as runtimes that carry their own tokenizer store it (GGUF's
// tokenizer.ggml.* keys): every token by id, how each is used, and the BPE merges by rank.
type Vocab struct {
	Tokens []string // by id; ids with no token are ""
	// Added marks added_tokens entries; Special those of them marked special.
	Added, Special []bool
	Merges         []string // "left right", lowest rank first
	// ByteLevel is set when tokens are GPT-2 byte-level strings (a ByteLevel decoder).
	ByteLevel bool
	// ByteFallback is set for SentencePiece-style BPE with <0xNN> byte tokens.
	ByteFallback bool
}

// Vocab returns the tokenizer's vocabulary and merges.
func (t *Tokenizer) Vocab() Vocab {
	v := Vocab{
		Tokens:       make([]string, t.vocabSize),
		Added:        make([]bool, t.vocabSize),
		Special:      make([]bool, t.vocabSize),
		ByteFallback: t.model.byteFallback,
	}
	_, v.ByteLevel = t.decoder.(byteLevelDecoder)
	for id, tok := range t.modelTokensByID {
		v.Tokens[id] = tok
	}
	for _, a := range t.added {
		v.Tokens[a.ID], v.Added[a.ID], v.Special[a.ID] = a.Content, true, a.Special
	}
	type ranked struct {
		rank int
		s    string
	}
	merges := make([]ranked, 0, len(t.model.merges))
	for pair, rule := range t.model.merges {
		merges = append(merges, ranked{rule.rank, t.modelTokensByID[pair.left] + " " + t.modelTokensByID[pair.right]})
	}
	sort.Slice(merges, func(i, j int) bool { return merges[i].rank < merges[j].rank })
	for _, m := range merges {
		v.Merges = append(v.Merges, m.s)
	}
	return v
}
