package ggufexport

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/qpack-dev/qpack/gguf"
	"github.com/qpack-dev/qpack/tokenizer"
)

// Tokenizer rebuilds the tokenizer a GGUF file carries (tokenizer.ggml.*), for text data
// given to a GGUF model: byte-level BPE ("gpt2") with the pre-tokenizer llama.cpp selects by
// tokenizer.ggml.pre (gpt-2, llama-bpe or qwen2), control and user-defined tokens as added
// tokens. Other tokenizers are refused by name.
func Tokenizer(f *gguf.File) (*tokenizer.Tokenizer, error) {
	b, err := tokenizerJSON(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", f.Path, err)
	}
	t, err := tokenizer.FromJSON(b)
	if err != nil {
		return nil, fmt.Errorf("%s: the tokenizer in its metadata: %w", f.Path, err)
	}
	return t, nil
}

// splitPre is a Split pre-tokenizer followed by byte-level mapping, as Llama 3 and Qwen2 write it.
func splitPre(pattern string) map[string]any {
	return map[string]any{"type": "Sequence", "pretokenizers": []any{
		map[string]any{"type": "Split", "pattern": map[string]string{"Regex": pattern}, "behavior": "Isolated", "invert": false},
		map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
	}}
}

// preTokenizers are the tokenizer.json pre-tokenizers of llama.cpp's pre names, and whether
// the BPE model ignores merges for whole-vocabulary words (llama.cpp does so for llama-bpe).
var preTokenizers = map[string]struct {
	pre          map[string]any
	ignoreMerges bool
}{
	"gpt-2":     {map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}, false},
	"llama-bpe": {splitPre(llama3Pattern), true},
	"qwen2":     {splitPre(qwen2Pattern), false},
}

func tokenizerJSON(f *gguf.File) ([]byte, error) {
	str := func(key string) string { v, _ := f.Get(key); s, _ := v.(string); return s }
	if m := str("tokenizer.ggml.model"); m != "gpt2" {
		return nil, fmt.Errorf("tokenizer.ggml.model %q: only byte-level BPE (gpt2) tokenizers are rebuilt", m)
	}
	pre, ok := preTokenizers[str("tokenizer.ggml.pre")]
	if !ok {
		return nil, fmt.Errorf("tokenizer.ggml.pre %q: known here are gpt-2, llama-bpe and qwen2", str("tokenizer.ggml.pre"))
	}
	v, _ := f.Get("tokenizer.ggml.tokens")
	tokens, ok := v.([]string)
	if !ok || len(tokens) == 0 {
		return nil, fmt.Errorf("no tokenizer.ggml.tokens string array")
	}
	v, _ = f.Get("tokenizer.ggml.merges")
	merges, _ := v.([]string)
	v, _ = f.Get("tokenizer.ggml.token_type")
	types, _ := v.([]int32)
	if types != nil && len(types) != len(tokens) {
		return nil, fmt.Errorf("%d token types for %d tokens", len(types), len(tokens))
	}
	vocab := make(map[string]int, len(tokens))
	var added []map[string]any
	for id, tok := range tokens {
		typ := tokenNormal
		if types != nil {
			typ = types[id]
		}
		switch typ {
		case tokenUnused:
			continue
		case tokenControl, tokenUserDefined:
			added = append(added, map[string]any{"id": id, "content": tok, "single_word": false, "lstrip": false,
				"rstrip": false, "normalized": typ == tokenUserDefined, "special": typ == tokenControl})
		}
		if _, dup := vocab[tok]; !dup {
			vocab[tok] = id
		}
	}
	for i, m := range merges {
		if strings.Count(m, " ") != 1 {
			return nil, fmt.Errorf("merge %d %q is not two tokens", i, m)
		}
	}
	doc := map[string]any{
		"version": "1.0", "added_tokens": added, "normalizer": nil, "pre_tokenizer": pre.pre, "post_processor": nil,
		"decoder": map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
		"model": map[string]any{"type": "BPE", "vocab": vocab, "merges": merges, "ignore_merges": pre.ignoreMerges,
			"fuse_unk": false, "byte_fallback": false},
	}
	return json.Marshal(doc)
}
