package core

import (
	"strings"
	"unicode/utf8"
)

// MaxLabelBytes bounds a model or a group as a label or a log field:
// model IDs are far shorter.
const MaxLabelBytes = 256

// BoundedText returns v as a span attribute or a log field may carry it:
// valid UTF-8 (each invalid byte replaced), cut to at most MaxLabelBytes
// on a character's boundary. A value that is both already is returned as
// it is.
func BoundedText(v string) string {
	return CutText(v, MaxLabelBytes)
}

// CutText returns v as valid UTF-8 (each invalid byte replaced) of at most
// most bytes, cut on a character's boundary, and no longer sharing v's
// memory when it was changed. A value that is both already is returned as
// it is.
func CutText(v string, most int) string {
	if len(v) <= most && utf8.ValidString(v) {
		return v
	}
	v = strings.ToValidUTF8(v[:min(len(v), most)], "\uFFFD")
	if len(v) > most {
		cut := most
		for cut > 0 && !utf8.RuneStart(v[cut]) {
			cut--
		}
		v = v[:cut]
	}
	return strings.Clone(v)
}
