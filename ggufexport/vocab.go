package ggufexport

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/qpack-dev/qpack/gguf"
	"github.com/qpack-dev/qpack/tokenizer"
)

// llama.cpp's token types (llama_token_type / gguf-py TokenType).
const (
	tokenNormal      int32 = 1
	tokenControl     int32 = 3
	tokenUserDefined int32 = 4
	tokenUnused      int32 = 5
)

// The Split regexes of the tokenizers llama.cpp knows by a pre-tokenizer name.
const (
	llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	qwen2Pattern  = `(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	qwen2PatternI = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

type preTokenizerJSON struct {
	Type           string                 `json:"type"`
	UseRegex       *bool                  `json:"use_regex"`
	AddPrefixSpace bool                   `json:"add_prefix_space"`
	Pattern        struct{ Regex string } `json:"pattern"`
	PreTokenizers  []preTokenizerJSON     `json:"pretokenizers"`
}

// preName picks tokenizer.ggml.pre, the name llama.cpp selects its pre-tokenizer regex by,
// from the tokenizer.json pre-tokenizer: plain GPT-2 ByteLevel is "gpt-2"; a Split with
// Llama 3's or Qwen2's regex is "llama-bpe" or "qwen2". Anything else is refused, since
// llama.cpp would split text differently; the caller may name one explicitly.
func preName(raw json.RawMessage) (string, error) {
	var p preTokenizerJSON
	if err := json.Unmarshal(raw, &p); err != nil {
		return "", fmt.Errorf("pre_tokenizer: %w", err)
	}
	if p.Type == "ByteLevel" && (p.UseRegex == nil || *p.UseRegex) && !p.AddPrefixSpace {
		return "gpt-2", nil
	}
	if p.Type == "Sequence" {
		for _, q := range p.PreTokenizers {
			switch {
			case q.Type != "Split":
			case q.Pattern.Regex == llama3Pattern:
				return "llama-bpe", nil
			case q.Pattern.Regex == qwen2Pattern || q.Pattern.Regex == qwen2PatternI:
				return "qwen2", nil
			}
		}
	}
	return "", fmt.Errorf("pre-tokenizer %s matches none llama.cpp names here (gpt-2, llama-bpe, qwen2); name one with --tokenizer-pre", raw)
}

type tokenizerFiles struct {
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor *struct {
		Single []map[string]any `json:"single"`
	} `json:"post_processor"`
}

type tokenizerConfig struct {
	AddBOS       *bool `json:"add_bos_token"`
	ChatTemplate any   `json:"chat_template"`
}

// tokenizerKVs are the tokenizer.ggml.* KVs of a byte-level BPE tokenizer.json padded to
// vocabSize entries (the embedding's rows), as convert_hf_to_gguf.py's get_vocab_base writes
// them: added special tokens are control tokens, other added tokens user-defined, and ids the
// tokenizer lacks "[PAD<id>]" unused tokens.
func tokenizerKVs(dir string, vocabSize int, e extraConfig, pre string) ([]gguf.KV, error) {
	path := filepath.Join(dir, "tokenizer.json")
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s: no tokenizer.json; a GGUF file carries its tokenizer, so one is needed", dir)
	}
	if err != nil {
		return nil, err
	}
	tok, err := tokenizer.FromJSON(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	v := tok.Vocab()
	if !v.ByteLevel {
		return nil, fmt.Errorf("%s: not a byte-level BPE tokenizer (SentencePiece-style tokenizers are not exported to GGUF yet)", path)
	}
	if len(v.Tokens) > vocabSize {
		return nil, fmt.Errorf("%s: %d tokens, more than the model's vocab_size %d", path, len(v.Tokens), vocabSize)
	}
	var files tokenizerFiles
	if err := json.Unmarshal(data, &files); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if pre == "" {
		if pre, err = preName(files.PreTokenizer); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	tokens := make([]string, vocabSize)
	types := make([]int32, vocabSize)
	for id := range tokens {
		switch {
		case id >= len(v.Tokens) || v.Tokens[id] == "":
			tokens[id], types[id] = fmt.Sprintf("[PAD%d]", id), tokenUnused
		case v.Special[id]:
			tokens[id], types[id] = v.Tokens[id], tokenControl
		case v.Added[id]:
			tokens[id], types[id] = v.Tokens[id], tokenUserDefined
		default:
			tokens[id], types[id] = v.Tokens[id], tokenNormal
		}
	}
	kvs := []gguf.KV{
		{Key: "tokenizer.ggml.model", Value: "gpt2"},
		{Key: "tokenizer.ggml.pre", Value: pre},
		{Key: "tokenizer.ggml.tokens", Value: tokens},
		{Key: "tokenizer.ggml.token_type", Value: types},
		{Key: "tokenizer.ggml.merges", Value: v.Merges},
	}
	ids := []struct {
		key string
		id  *int
	}{{"bos_token_id", e.BOS}, {"padding_token_id", e.Pad}}
	if eos, ok := firstID(e.EOS); ok {
		ids = append(ids, struct {
			key string
			id  *int
		}{"eos_token_id", &eos})
	}
	for _, x := range ids {
		if x.id == nil {
			continue
		}
		if *x.id < 0 || *x.id >= vocabSize {
			return nil, fmt.Errorf("config.json: %s %d is outside the vocabulary (%d)", x.key, *x.id, vocabSize)
		}
		kvs = append(kvs, gguf.KV{Key: "tokenizer.ggml." + x.key, Value: uint32(*x.id)})
	}
	addBOS, template, err := readTokenizerConfig(dir)
	if err != nil {
		return nil, err
	}
	if addBOS == nil { // the post-processor adding a special token first means BOS is added
		b := files.PostProcessor != nil && len(files.PostProcessor.Single) > 0 && files.PostProcessor.Single[0]["SpecialToken"] != nil
		addBOS = &b
	}
	kvs = append(kvs, gguf.KV{Key: "tokenizer.ggml.add_bos_token", Value: *addBOS})
	if template != "" {
		kvs = append(kvs, gguf.KV{Key: "tokenizer.chat_template", Value: template})
	}
	return kvs, nil
}

// readTokenizerConfig reads add_bos_token and a single chat_template string from
// tokenizer_config.json when there is one.
func readTokenizerConfig(dir string) (*bool, string, error) {
	path := filepath.Join(dir, "tokenizer_config.json")
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", err
	}
	var c tokenizerConfig
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, "", fmt.Errorf("%s: %w", path, err)
	}
	s, _ := c.ChatTemplate.(string)
	return c.AddBOS, s, nil
}
