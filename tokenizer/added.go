package tokenizer

import (
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// addedToken is an entry of tokenizer.json's added_tokens: text that is cut out of the input
// whole, before normalization (normalized=false) or after it, and never seen by the model.
type addedToken struct {
	ID         int    `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// segment is a stretch of input: an added token (id >= 0) or text still to be tokenized.
type segment struct {
	text    string
	id      int
	atStart bool
}

// addedMatcher finds added tokens leftmost-longest, as the reference's Aho-Corasick automaton
// does. Added tokens are few and often share a first byte ('<'), so they are grouped by first
// byte and tried longest first.
type addedMatcher struct {
	byFirstByte [256][]matchTarget
}

type matchTarget struct {
	pattern string
	token   *addedToken
}

// newAddedMatcher indexes the tokens under the given patterns (their content, or their
// normalized content). It returns nil when there is nothing to match.
func newAddedMatcher(targets []matchTarget) *addedMatcher {
	if len(targets) == 0 {
		return nil
	}
	m := &addedMatcher{}
	for _, t := range targets {
		if t.pattern == "" {
			continue
		}
		b := t.pattern[0]
		m.byFirstByte[b] = append(m.byFirstByte[b], t)
	}
	for _, list := range m.byFirstByte {
		sort.SliceStable(list, func(i, j int) bool { return len(list[i].pattern) > len(list[j].pattern) })
	}
	return m
}

// longestAt returns the longest pattern that s[i:] starts with.
func (m *addedMatcher) longestAt(s string, i int) (matchTarget, bool) {
	for _, t := range m.byFirstByte[s[i]] {
		if strings.HasPrefix(s[i:], t.pattern) {
			return t, true
		}
	}
	return matchTarget{}, false
}

// split cuts s into added tokens and the text around them, honouring single_word, lstrip and
// rstrip like the reference's AddedVocabulary::find_matches. Empty text segments are dropped.
func (m *addedMatcher) split(s string, atStart bool) []segment {
	if m == nil {
		return []segment{{s, -1, atStart}}
	}
	var out []segment
	emitted := 0 // end of what has been emitted
	for i := 0; i < len(s); {
		t, ok := m.longestAt(s, i)
		if !ok {
			i++
			continue
		}
		start, stop := i, i+len(t.pattern)
		i = stop
		if t.token.SingleWord && (endsWithWordChar(s[:start]) || startsWithWordChar(s[stop:])) {
			continue
		}
		if t.token.LStrip {
			start = max(len(strings.TrimRightFunc(s[:start], unicode.IsSpace)), emitted)
		}
		if t.token.RStrip {
			stop = len(s) - len(strings.TrimLeftFunc(s[stop:], unicode.IsSpace))
			i = stop
		}
		if start > emitted {
			out = append(out, segment{s[emitted:start], -1, atStart && emitted == 0})
		}
		out = append(out, segment{s[start:stop], t.token.ID, false})
		emitted = stop
	}
	if emitted < len(s) {
		out = append(out, segment{s[emitted:], -1, atStart && emitted == 0})
	}
	return out
}

// isWordChar is the regex class \w in its Unicode sense.
func isWordChar(r rune) bool {
	return r == '_' || unicode.IsLetter(r) || unicode.IsMark(r) || unicode.In(r, unicode.Nd, unicode.Nl, unicode.Pc)
}

func endsWithWordChar(s string) bool {
	r, size := utf8.DecodeLastRuneInString(s)
	return size > 0 && isWordChar(r)
}

func startsWithWordChar(s string) bool {
	r, size := utf8.DecodeRuneInString(s)
	return size > 0 && isWordChar(r)
}
