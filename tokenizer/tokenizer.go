// Package tokenizer encodes and decodes text with a Hugging Face tokenizer.json in pure Go.
//
// It follows the reference Rust implementation step by step: added tokens are cut out of the input,
// the rest is normalized, pre-tokenized into words, and each word is split into BPE tokens; an
// optional post-processor adds special tokens. Components it does not implement are refused when the
// file is loaded, naming their type, so an encode is never silently different from the reference.
// The truncation and padding sections are ignored: they shape batches, not tokens.
package tokenizer

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"unicode/utf8"
)

// Tokenizer is a loaded tokenizer.json. It is safe for concurrent use.
type Tokenizer struct {
	model         *bpe
	normalizer    normalizer    // nil: none
	preTokenizer  preTokenizer  // nil: the text is one word
	postProcessor postProcessor // nil: none
	decoder       decoder       // nil: tokens joined by spaces

	added           []addedToken
	rawMatcher      *addedMatcher // added tokens matched in the raw input
	normMatcher     *addedMatcher // added tokens matched after normalization
	addedByID       map[int]string
	addedByContent  map[string]int
	modelTokensByID map[int]string
	vocabSize       int
}

// EncodeOptions changes what Encode adds around the text.
type EncodeOptions struct {
	// AddSpecial runs the post-processor, which adds tokens such as BOS when the file asks for them.
	AddSpecial bool
}

type tokenizerJSON struct {
	AddedTokens   []addedToken    `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	Model         json.RawMessage `json:"model"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
}

// Load reads a tokenizer.json file.
func Load(path string) (*Tokenizer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	t, err := FromJSON(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// FromJSON builds a tokenizer from the contents of a tokenizer.json file.
func FromJSON(data []byte) (*Tokenizer, error) {
	var c tokenizerJSON
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	if isNull(c.Model) {
		return nil, fmt.Errorf("tokenizer.json: no model")
	}
	t := &Tokenizer{added: c.AddedTokens}
	var err error
	if t.model, err = parseModel(c.Model); err != nil {
		return nil, err
	}
	if t.normalizer, err = parseNormalizer(c.Normalizer); err != nil {
		return nil, err
	}
	if t.preTokenizer, err = parsePreTokenizer(c.PreTokenizer); err != nil {
		return nil, err
	}
	if t.postProcessor, err = parsePostProcessor(c.PostProcessor); err != nil {
		return nil, err
	}
	if t.decoder, err = parseDecoder(c.Decoder); err != nil {
		return nil, err
	}
	if err := t.indexVocab(); err != nil {
		return nil, err
	}
	t.buildAddedMatchers()
	return t, nil
}

func (t *Tokenizer) indexVocab() error {
	t.modelTokensByID = make(map[int]string, len(t.model.vocab))
	for tok, id := range t.model.vocab {
		if id < 0 {
			return fmt.Errorf("model: token %q has negative id %d", tok, id)
		}
		t.modelTokensByID[id] = tok
		t.vocabSize = max(t.vocabSize, id+1)
	}
	t.addedByID = make(map[int]string, len(t.added))
	t.addedByContent = make(map[string]int, len(t.added))
	for _, a := range t.added {
		if a.ID < 0 {
			return fmt.Errorf("added token %q has negative id %d", a.Content, a.ID)
		}
		if a.Content == "" {
			return fmt.Errorf("added token %d has empty content", a.ID)
		}
		t.addedByID[a.ID] = a.Content
		t.addedByContent[a.Content] = a.ID
		t.vocabSize = max(t.vocabSize, a.ID+1)
	}
	return nil
}

// buildAddedMatchers splits added tokens into those matched in the raw text and those matched in
// normalized text (under their normalized form), as the reference does.
func (t *Tokenizer) buildAddedMatchers() {
	var raw, normalized []matchTarget
	for i := range t.added {
		a := &t.added[i]
		if !a.Normalized {
			raw = append(raw, matchTarget{a.Content, a})
			continue
		}
		pattern := a.Content
		if t.normalizer != nil {
			pattern = t.normalizer.normalize(pattern)
		}
		normalized = append(normalized, matchTarget{pattern, a})
	}
	t.rawMatcher = newAddedMatcher(raw)
	t.normMatcher = newAddedMatcher(normalized)
}

// Encode returns the token ids of text without special tokens. Invalid UTF-8 is read as U+FFFD.
func (t *Tokenizer) Encode(text string) []int {
	return t.EncodeWith(text, EncodeOptions{})
}

// EncodeWith returns the token ids of text, with the post-processor's special tokens when asked.
func (t *Tokenizer) EncodeWith(text string, opts EncodeOptions) []int {
	if !utf8.ValidString(text) {
		text = lossyUTF8([]byte(text))
	}
	var ids []int
	for _, seg := range t.rawMatcher.split(text, true) {
		if seg.id >= 0 {
			ids = append(ids, seg.id)
			continue
		}
		normalized := seg.text
		if t.normalizer != nil {
			normalized = t.normalizer.normalize(normalized)
		}
		for _, sub := range t.normMatcher.split(normalized, seg.atStart) {
			if sub.id >= 0 {
				ids = append(ids, sub.id)
				continue
			}
			ids = t.appendWords(ids, sub)
		}
	}
	if opts.AddSpecial && t.postProcessor != nil {
		ids = t.postProcessor.process(ids)
	}
	return ids
}

// appendWords pre-tokenizes normalized text and appends the model's ids for every word.
func (t *Tokenizer) appendWords(ids []int, seg segment) []int {
	if seg.text == "" {
		return ids
	}
	words := []piece{{seg.text, seg.atStart}}
	if t.preTokenizer != nil {
		words = t.preTokenizer.preTokenize(words)
	}
	for _, w := range words {
		ids = append(ids, t.model.tokenize(w.text)...)
	}
	return ids
}

// Decode returns the text of ids, special tokens included; ids without a token are skipped.
func (t *Tokenizer) Decode(ids []int) string {
	tokens := make([]string, 0, len(ids))
	for _, id := range ids {
		if tok, ok := t.Token(id); ok {
			tokens = append(tokens, tok)
		}
	}
	if t.decoder == nil {
		return strings.Join(tokens, " ")
	}
	return strings.Join(t.decoder.decode(tokens), "")
}

// VocabSize is one more than the largest id of the model vocab and the added tokens: the number
// of rows an embedding table needs.
func (t *Tokenizer) VocabSize() int { return t.vocabSize }

// TokenID returns the id of a token (added tokens first, then the model vocab).
func (t *Tokenizer) TokenID(token string) (int, bool) {
	if id, ok := t.addedByContent[token]; ok {
		return id, true
	}
	id, ok := t.model.vocab[token]
	return id, ok
}

// Token returns the token of an id (added tokens first, then the model vocab).
func (t *Tokenizer) Token(id int) (string, bool) {
	if tok, ok := t.addedByID[id]; ok {
		return tok, true
	}
	tok, ok := t.modelTokensByID[id]
	return tok, ok
}
