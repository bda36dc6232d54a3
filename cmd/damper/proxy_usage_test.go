package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/damper-ai/damper-go/conf"
)

// TestProxyUsageListsEveryKey: damper proxy -h lists every key of the
// proxy's file as its tags declare it, a line each with its default and
// bounds, and its doc below; a key with a flag names it, and the flag is
// among the flags. A key added to the file is listed with nothing to
// write but its tags, and one declared with no doc fails here.
func TestProxyUsageListsEveryKey(t *testing.T) {
	var out bytes.Buffer
	if code := run([]string{"proxy", "-h"}, &out, io.Discard); code != exitOK {
		t.Fatalf("proxy -h: exit %d", code)
	}
	usage := out.String()
	keys, err := conf.Settings(reflect.TypeFor[proxyFile]())
	if err != nil {
		t.Fatal(err)
	}
	flags := map[string]string{}
	for _, k := range proxyKeys() {
		flags[k.Key] = k.Flag
	}
	lines := strings.Split(usage, "\n")
	listed := 0
	for _, k := range keys {
		i := -1
		for j, l := range lines {
			if name, _, _ := strings.Cut(strings.TrimPrefix(l, "  "), ":"); strings.HasPrefix(l, "  ") && !strings.HasPrefix(l, "   ") &&
				strings.Fields(name + " ")[0] == k.Key {
				i = j
				break
			}
		}
		if i < 0 {
			t.Errorf("the usage has no line for the key %s", k.Key)
			continue
		}
		listed++
		line := lines[i]
		want := []string{k.Range}
		if k.Key != "upstream" { // the command's default, not the library's
			want = append(want, k.Default)
		}
		if k.Zero != "" {
			want = append(want, "0: "+k.Zero)
		}
		if f := flags[k.Key]; f != "" {
			want = append(want, "(-"+f+")")
			if !strings.Contains(usage, "\n  -"+f+" ") {
				t.Errorf("the flags lack -%s, the flag of %s", f, k.Key)
			}
		}
		for _, w := range want {
			if !strings.Contains(line, w) {
				t.Errorf("the line of %s, %q, lacks %q", k.Key, line, w)
			}
		}
		if i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], "      ") || strings.TrimSpace(lines[i+1]) == "" {
			t.Errorf("the key %s has no doc below its line: give its field a doc tag", k.Key)
		}
	}
	if listed != len(keys) || len(keys) < 19 {
		t.Errorf("%d keys listed of the file's %d", listed, len(keys))
	}
}

// TestProxyFlagBoundsAreTheFiles: a flag's value is checked as its key's
// value in the file is, by the same tags: for values below, at and past
// each bound (and a few a check refuses), the flag is refused exactly
// when the key is, with the same words after the name and the value.
func TestProxyFlagBoundsAreTheFiles(t *testing.T) {
	dir := t.TempDir()
	kinds := keyKinds(reflect.TypeFor[proxyFile]())
	values := map[reflect.Kind][]string{
		reflect.Int64:  {"-1", "0", "1", "1023", "1024", "65536", "65537", "536870912", "536870913", "9223372036854775807"},
		reflect.String: {"", "loud", "debug", "ftp://x", "http://127.0.0.1:9", "https://api.example.com?key=1", "nowhere", "127.0.0.1:0"},
	}
	durations := []string{"-1s", "0s", "1ns", "1s", "24h", "24h0m0.000000001s", "25h"}
	checked := 0
	for _, k := range proxyKeys() {
		if k.Flag == "" {
			continue
		}
		typ, ok := kinds[k.Key]
		if !ok {
			t.Fatalf("no field of proxyFile has the key %s", k.Key)
		}
		kind := typ.Kind()
		if kind == reflect.Int {
			kind = reflect.Int64
		}
		vs := values[kind]
		if typ == reflect.TypeFor[time.Duration]() {
			vs = durations
		}
		if len(vs) == 0 {
			t.Fatalf("no values to try for %s, a %v", k.Key, typ)
		}
		for i, v := range vs {
			path := filepath.Join(dir, k.Key+strconv.Itoa(i)+".yaml")
			if err := os.WriteFile(path, []byte(k.Key+": "+strconv.Quote(v)+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if kind == reflect.Int64 {
				if err := os.WriteFile(path, []byte(k.Key+": "+v+"\n"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			_, fileErr := parseProxy([]string{"-config", path}, io.Discard, io.Discard)
			_, flagErr := parseProxy([]string{"-" + k.Flag + "=" + v}, io.Discard, io.Discard)
			checked++
			if (fileErr == nil) != (flagErr == nil) {
				t.Errorf("%s %q: the file's error %v, the flag's %v", k.Key, v, fileErr, flagErr)
				continue
			}
			if fileErr == nil {
				continue
			}
			fileWhy := whyOf(strings.TrimPrefix(fileErr.Error(), path+": "), k.Key+": ")
			flagWhy := whyOf(flagErr.Error(), "--"+k.Flag+" ")
			if strings.ReplaceAll(fileWhy, "leave the key out", "leave the flag out") != flagWhy {
				t.Errorf("%s %q: the file says %q, the flag %q", k.Key, v, fileErr, flagErr)
			}
		}
	}
	if checked < 40 {
		t.Errorf("%d values checked", checked)
	}
}

// whyOf is an error's message after the name and the value: what the
// value must be.
func whyOf(msg, name string) string {
	rest, ok := strings.CutPrefix(msg, name)
	if !ok {
		return msg // an error of no key, such as the listen address's
	}
	if strings.HasPrefix(rest, `"`) { // a quoted value, which may hold ": "
		if q, err := strconv.QuotedPrefix(rest); err == nil {
			return strings.TrimPrefix(rest[len(q):], ": ")
		}
	}
	_, why, _ := strings.Cut(rest, ": ")
	return why
}

// keyKinds returns the type of each key of struct type t, an inline
// struct's included.
func keyKinds(t reflect.Type) map[string]reflect.Type {
	kinds := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		switch key := f.Tag.Get("key"); key {
		case "", "-":
		case ",inline":
			for k, v := range keyKinds(f.Type) {
				kinds[k] = v
			}
		default:
			kinds[key] = f.Type
		}
	}
	return kinds
}
