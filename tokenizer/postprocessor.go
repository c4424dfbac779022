package tokenizer

import (
	"encoding/json"
	"fmt"
)

// A postProcessor adds special tokens (BOS, CLS/SEP) around an encoded sequence.
type postProcessor interface {
	process(ids []int) []int
}

// template is TemplateProcessing's "single" template: special tokens and the sequence "$A".
type template []templateItem

type templateItem struct {
	ids      []int // the special token's ids; nil for the sequence itself
	sequence bool
}

func (t template) process(ids []int) []int {
	out := make([]int, 0, len(ids)+len(t))
	for _, item := range t {
		if item.sequence {
			out = append(out, ids...)
		} else {
			out = append(out, item.ids...)
		}
	}
	return out
}

// noPostProcess is the ByteLevel post-processor, which only adjusts offsets.
type noPostProcess struct{}

func (noPostProcess) process(ids []int) []int { return ids }

type postProcessorSequence []postProcessor

func (seq postProcessorSequence) process(ids []int) []int {
	for _, p := range seq {
		ids = p.process(ids)
	}
	return ids
}

type postProcessorJSON struct {
	Type       string            `json:"type"`
	Processors []json.RawMessage `json:"processors"`
	Single     []struct {
		SpecialToken *struct {
			ID string `json:"id"`
		} `json:"SpecialToken"`
		Sequence *struct {
			ID string `json:"id"`
		} `json:"Sequence"`
	} `json:"single"`
	SpecialTokens map[string]struct {
		IDs []int `json:"ids"`
	} `json:"special_tokens"`
	Cls []json.RawMessage `json:"cls"`
	Sep []json.RawMessage `json:"sep"`
}

// parsePostProcessor builds a post-processor from tokenizer.json; null gives nil.
func parsePostProcessor(raw json.RawMessage) (postProcessor, error) {
	if isNull(raw) {
		return nil, nil
	}
	var c postProcessorJSON
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("post_processor: %w", err)
	}
	switch c.Type {
	case "ByteLevel":
		return noPostProcess{}, nil
	case "TemplateProcessing":
		return parseTemplate(c)
	case "BertProcessing", "RobertaProcessing":
		cls, err := tokenIDPair(c.Cls)
		if err != nil {
			return nil, fmt.Errorf("post_processor %s cls: %w", c.Type, err)
		}
		sep, err := tokenIDPair(c.Sep)
		if err != nil {
			return nil, fmt.Errorf("post_processor %s sep: %w", c.Type, err)
		}
		return template{{ids: []int{cls}}, {sequence: true}, {ids: []int{sep}}}, nil
	case "Sequence":
		var seq postProcessorSequence
		for _, sub := range c.Processors {
			p, err := parsePostProcessor(sub)
			if err != nil {
				return nil, err
			}
			if p != nil {
				seq = append(seq, p)
			}
		}
		return seq, nil
	}
	return nil, fmt.Errorf("unsupported post_processor type %q", c.Type)
}

func parseTemplate(c postProcessorJSON) (template, error) {
	var t template
	for _, item := range c.Single {
		switch {
		case item.Sequence != nil:
			if item.Sequence.ID != "A" {
				return nil, fmt.Errorf("post_processor TemplateProcessing: single template uses sequence %q, want A", item.Sequence.ID)
			}
			t = append(t, templateItem{sequence: true})
		case item.SpecialToken != nil:
			special, ok := c.SpecialTokens[item.SpecialToken.ID]
			if !ok {
				return nil, fmt.Errorf("post_processor TemplateProcessing: special token %q is not in special_tokens", item.SpecialToken.ID)
			}
			t = append(t, templateItem{ids: special.IDs})
		default:
			return nil, fmt.Errorf("post_processor TemplateProcessing: template item is neither SpecialToken nor Sequence")
		}
	}
	return t, nil
}

// tokenIDPair reads BertProcessing's ["[CLS]", 101] and returns the id.
func tokenIDPair(raw []json.RawMessage) (int, error) {
	var id int
	if len(raw) != 2 || json.Unmarshal(raw[1], &id) != nil {
		return 0, fmt.Errorf("want [token, id]")
	}
	return id, nil
}
