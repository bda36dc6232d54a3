package conf

import (
	"errors"
	"flag"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"
)

type flagged struct {
	N     int           `key:"count" default:"3" min:"1" max:"10" flag:"count" doc:"how many"`
	Off   time.Duration `key:"pause" default:"1s" none:"means 0" min:"0" max:"1h" flag:"pause"`
	Ratio float64       `key:"ratio" in:"(0,1]" zero:"off" flag:"ratio"`
	Name  string        `key:"name" default:"x" flag:"name"`
	L     []string      `key:"list" max:"4" unit:"items"`
}

// TestSettings: each key with its default, its bounds in words and its
// doc and flag tags, in declaration order.
func TestSettings(t *testing.T) {
	got, err := Settings(reflect.TypeFor[flagged]())
	if err != nil {
		t.Fatal(err)
	}
	want := []Setting{
		{Key: "count", Default: "3", Range: "at least 1, at most 10", Doc: "how many", Flag: "count"},
		{Key: "pause", Default: "1s", Range: "at least 0, at most 1h", Flag: "pause"},
		{Key: "ratio", Range: "in (0, 1]", Zero: "off", Flag: "ratio"},
		{Key: "name", Default: "x", Flag: "name"},
		{Key: "list", Range: "at most 4 items"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Settings:\n%+v\nwant\n%+v", got, want)
	}
}

// TestFlagsCheckedAsTheFile: a flag's value is refused exactly when the
// same value in a file is, with the same words after the name and value;
// 0 is None where the field takes it; a flag not given leaves its key.
func TestFlagsCheckedAsTheFile(t *testing.T) {
	for _, tc := range []struct {
		flag, value, file string
	}{
		{"count", "0", `{"count": 0}`},
		{"count", "11", `{"count": 11}`},
		{"count", "-1", `{"count": -1}`},
		{"count", "5", `{"count": 5}`},
		{"pause", "2h", `{"pause": "2h"}`},
		{"pause", "-1ns", `{"pause": "-1ns"}`},
		{"pause", "0s", `{"pause": "0s"}`},
		{"ratio", "0", `{"ratio": 0}`},
		{"ratio", "1.5", `{"ratio": 1.5}`},
		{"ratio", "1", `{"ratio": 1}`},
	} {
		var fromFile flagged
		fileErr := DecodeJSON([]byte(tc.file), &fromFile)
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		settings, _ := Settings(reflect.TypeFor[flagged]())
		fl, err := NewFlags(fs, reflect.TypeFor[flagged](), settings)
		if err != nil {
			t.Fatal(err)
		}
		if err := fs.Parse([]string{"-" + tc.flag + "=" + tc.value}); err != nil {
			t.Fatal(err)
		}
		fromFlag := flagged{Name: "kept"}
		flagErr := fl.Set(&fromFlag)
		if (fileErr == nil) != (flagErr == nil) {
			t.Errorf("-%s %s: the file's error %v, the flag's %v", tc.flag, tc.value, fileErr, flagErr)
			continue
		}
		if fileErr == nil {
			fromFlag.Name = ""
			if !reflect.DeepEqual(fromFlag, fromFile) {
				t.Errorf("-%s %s: %+v, the file's %+v", tc.flag, tc.value, fromFlag, fromFile)
			}
			continue
		}
		_, fileWhy, _ := strings.Cut(strings.TrimPrefix(fileErr.Error(), tc.flag+": "), ": ")
		wantFlag := "--" + tc.flag + " " + tc.value + ": " + strings.ReplaceAll(fileWhy, "the key out", "the flag out")
		if tc.flag == "pause" {
			wantFlag = strings.Replace(wantFlag, " 2h:", " 2h0m0s:", 1)
		}
		if flagErr.Error() != wantFlag {
			t.Errorf("-%s %s: %q, want %q (the file's %q)", tc.flag, tc.value, flagErr, wantFlag, fileErr)
		}
	}
}

// TestFlagsName: an error of a key a flag set is named by the flag.
func TestFlagsName(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	settings, _ := Settings(reflect.TypeFor[flagged]())
	fl, err := NewFlags(fs, reflect.TypeFor[flagged](), settings)
	if err != nil {
		t.Fatal(err)
	}
	if err := fs.Parse([]string{"-name", "y"}); err != nil {
		t.Fatal(err)
	}
	var v flagged
	if err := fl.Set(&v); err != nil || v.Name != "y" {
		t.Fatalf("Set: %+v, %v", v, err)
	}
	e := &Error{Path: "name", Err: errors.New(`"y": want z`)}
	if got := fl.Name(e).Error(); got != `--name "y": want z` {
		t.Errorf("Name: %q", got)
	}
	other := &Error{Path: "count", Err: errors.New("0: no")}
	if got := fl.Name(other); got != other {
		t.Errorf("Name of a key no flag set: %v", got)
	}
}
