package main

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// What the proxy's file may name, and how its errors show a value: a
// file's values are the operator's, but an error goes to logs, so a value
// is cut, and what may be a secret is never shown.

// maxEnvName bounds the name of an environment variable a file names.
const maxEnvName = 128

// shown is a value as an error shows it: quoted, and cut at 64 bytes.
func shown(s string) string {
	const most = 64
	if len(s) > most {
		return strconv.Quote(s[:most]) + "..."
	}
	return strconv.Quote(s)
}

// shownURL is a URL as an error shows it: masked (maskURL), then as
// shown shows a value.
func shownURL(s string) string { return shown(maskURL(s)) }

// maxShownURL bounds a URL as errors and log lines show it.
const maxShownURL = 128

// urlMask replaces what a shown URL hides.
const urlMask = "xxxxx"

// maskURL is a URL as the proxy shows it anywhere, in errors, log lines
// and metrics: its user information, every query value, every query key
// but an option's plain name, and its fragment replaced, which may hold a
// password or a token, and cut at maxShownURL
// bytes. It reads s as text, not through url.Parse, so that a URL the
// parser refuses is masked the same way; what may be user information
// (up to the last '@' before the query) is masked whole.
func maskURL(s string) string {
	var b strings.Builder
	rest, frag, hasFrag := strings.Cut(s, "#")
	rest, query, hasQuery := strings.Cut(rest, "?")
	start := 0
	if i := strings.Index(rest, "://"); i >= 0 {
		start = i + len("://")
	}
	if at := strings.LastIndex(rest[start:], "@"); at >= 0 {
		b.WriteString(rest[:start])
		b.WriteString(urlMask)
		b.WriteString(rest[start+at:])
	} else {
		b.WriteString(rest)
	}
	if hasQuery {
		b.WriteByte('?')
		for i, part := range strings.Split(query, "&") {
			if i > 0 {
				b.WriteByte('&')
			}
			// A key is shown when it is an option's name: a '?' in the
			// user information can put a password where a key goes.
			if key, _, ok := strings.Cut(part, "="); ok {
				if len(key) > 64 || !allChars(key, func(c byte) bool { return alnum(c) || c == '_' || c == '-' || c == '.' }) {
					key = urlMask
				}
				b.WriteString(key)
				b.WriteByte('=')
			}
			if part != "" {
				b.WriteString(urlMask)
			}
			if b.Len() > maxShownURL {
				break
			}
		}
	}
	if hasFrag && frag != "" {
		b.WriteString("#" + urlMask)
	}
	out := b.String()
	if len(out) > maxShownURL {
		out = out[:maxShownURL] + "..."
	}
	return out
}

// scrubQueryValues is text, a parser's message about the URL raw, with
// every query value of raw that it quotes (as strconv.Quote does) masked.
func scrubQueryValues(text, raw string) string {
	_, query, _ := strings.Cut(raw, "?")
	query, _, _ = strings.Cut(query, "#")
	for part := range strings.SplitSeq(query, "&") {
		_, v, _ := strings.Cut(part, "=")
		if v == "" {
			continue
		}
		text = strings.ReplaceAll(text, strconv.Quote(v), strconv.Quote(urlMask))
		if d, err := url.QueryUnescape(v); err == nil && d != v {
			text = strings.ReplaceAll(text, strconv.Quote(d), strconv.Quote(urlMask))
		}
	}
	return text
}

// checkEnvName checks the name of an environment variable that holds a
// secret. Its errors never repeat the name: a secret may have been written
// where its variable's name goes.
func checkEnvName(name string) error {
	if len(name) > maxEnvName {
		return fmt.Errorf("want the name of an environment variable, at most %d characters", maxEnvName)
	}
	for i, r := range name {
		ok := r == '_' || (r >= 'A' && r <= 'Z') || (r >= 'a' && r <= 'z') || (i > 0 && r >= '0' && r <= '9')
		if !ok {
			return errors.New("want the name of an environment variable (letters, digits and _, not starting with a digit), not its value")
		}
	}
	if name == "" {
		return errors.New("want the name of an environment variable")
	}
	return nil
}
