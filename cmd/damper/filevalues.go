package main

import (
	"errors"
	"fmt"
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

// shownURL is a URL as an error shows it: its user information, which may
// be a password or a token, replaced.
func shownURL(s string) string {
	if at := strings.LastIndex(s, "@"); at >= 0 {
		if scheme, _, ok := strings.Cut(s, "://"); ok && len(scheme) < at {
			return shown(scheme + "://xxxxx" + s[at:])
		}
		return shown("xxxxx" + s[at:])
	}
	return shown(s)
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
