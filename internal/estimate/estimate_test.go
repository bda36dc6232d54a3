package estimate

import (
	"strings"
	"testing"
)

func TestInputTokens(t *testing.T) {
	text := []byte(`{"messages":[{"role":"user","content":"` + strings.Repeat("a", 400) + `"}]}`)
	if got := InputTokens(text); got != (len(text)+3)/4 {
		t.Errorf("text: %d tokens, want %d", got, (len(text)+3)/4)
	}
	image := []byte(`{"source":{"type":"base64","data":"` + strings.Repeat("QUJD", 100_000) + `"}}`)
	want := (len(image)-400_000+3)/4 + 1600
	if got := InputTokens(image); got != want {
		t.Errorf("image: %d tokens, want %d (a flat 1,600 for the payload)", got, want)
	}
}
