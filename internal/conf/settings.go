package conf

import (
	"errors"
	"flag"
	"fmt"
	"reflect"
	"strings"
	"time"
)

// Setting is one key of a struct's file as its field's tags declare it,
// for a command's usage text and its flags. Besides the tags the engine
// reads, a field may carry doc (what the setting does, one sentence or
// more) and flag (the name of the command-line flag that sets it).
type Setting struct {
	Key string
	// Default is the default as a file writes it ("30s"); "" for none.
	Default string
	// Range is what a value must be ("positive, at most 24h"); "" for
	// any value of its type.
	Range string
	// Zero is what 0 means in a field without a default ("no delay").
	Zero string
	Doc  string
	Flag string
}

// Settings returns the keys of struct type t, in declaration order, an
// inline struct's in its place.
func Settings(t reflect.Type) ([]Setting, error) {
	s, err := schemaOf(t)
	if err != nil {
		return nil, err
	}
	out := make([]Setting, 0, len(s.order))
	for _, k := range s.order {
		f, sf, err := s.lookup(k)
		if err != nil {
			return nil, err
		}
		out = append(out, Setting{Key: k, Default: f.defText, Range: f.rangeText(), Zero: f.zero,
			Doc: sf.Tag.Get("doc"), Flag: sf.Tag.Get("flag")})
	}
	return out, nil
}

// lookup returns the field of key k, inline structs walked through, and
// its declaration.
func (s *schema) lookup(k string) (*field, reflect.StructField, error) {
	path, ok := s.keys[k]
	if !ok {
		return nil, reflect.StructField{}, fmt.Errorf("conf: %s has no key %q", s.typ.Name(), k)
	}
	sc, t := s, s.typ
	var f *field
	var sf reflect.StructField
	for _, i := range path {
		f, sf = sc.byIndex(i), t.Field(i)
		if f.kind == kindInline {
			var err error
			if sc, err = schemaOf(f.typ); err != nil {
				return nil, sf, err
			}
			t = f.typ
		}
	}
	return f, sf, nil
}

// rangeText says what a value of the field must be, for a usage text.
func (f *field) rangeText() string {
	if len(f.enum) > 0 { // an enum, or a string of a set of values
		return orList(f.enum)
	}
	switch f.kind {
	case kindMap, kindSlice:
		if !f.hasHi {
			return ""
		}
		return strings.TrimSpace("at most " + f.hiText + " " + f.unit)
	case kindInt, kindFloat, kindDuration:
	default:
		return ""
	}
	if f.interval {
		return strings.TrimPrefix(f.whole(), "must be ")
	}
	var parts []string
	switch {
	case !f.hasLo:
	case f.loExcl && f.lo == 0:
		parts = append(parts, "positive")
	case f.loExcl:
		parts = append(parts, "above "+f.loText)
	default:
		parts = append(parts, "at least "+f.loText)
	}
	if f.hasHi {
		parts = append(parts, "at most "+f.hiText)
	}
	if len(parts) > 0 && f.unit != "" {
		parts[len(parts)-1] += " " + f.unit
	}
	return strings.Join(parts, ", ")
}

// Flags are the command-line flags of a struct's settings: each sets its
// key, checked as a file's value is.
type Flags struct {
	fs     *flag.FlagSet
	typ    reflect.Type
	byName map[string]*keyFlag
	given  map[string]string // key -> flag, for the flags Set set
}

type keyFlag struct {
	key   string
	f     *field
	path  []int
	value reflect.Value // what the flag package parsed into
}

// NewFlags defines on fs a flag for each of settings (of struct type t)
// that names one: of the flag package's type for its field's (a string,
// a whole number, a float, a duration or a bool), with its Default shown
// as the default and its Doc as the usage.
func NewFlags(fs *flag.FlagSet, t reflect.Type, settings []Setting) (*Flags, error) {
	s, err := schemaOf(t)
	if err != nil {
		return nil, err
	}
	fl := &Flags{fs: fs, typ: t, byName: map[string]*keyFlag{}}
	for _, st := range settings {
		if st.Flag == "" {
			continue
		}
		f, _, err := s.lookup(st.Key)
		if err != nil {
			return nil, err
		}
		def := reflect.New(f.typ).Elem()
		if st.Default != "" {
			if err := parseScalar(f, st.Default, def); err != nil {
				return nil, fmt.Errorf("conf: flag %s: default %q: %w", st.Flag, st.Default, err)
			}
		}
		var p any
		switch f.kind {
		case kindString:
			p = fs.String(st.Flag, def.String(), st.Doc)
		case kindBool:
			p = fs.Bool(st.Flag, def.Bool(), st.Doc)
		case kindDuration:
			p = fs.Duration(st.Flag, time.Duration(def.Int()), st.Doc)
		case kindFloat:
			p = fs.Float64(st.Flag, def.Float(), st.Doc)
		case kindInt:
			p = fs.Int64(st.Flag, def.Int(), st.Doc)
		default:
			return nil, fmt.Errorf("conf: flag %s: a %v takes no flag", st.Flag, f.typ)
		}
		fl.byName[st.Flag] = &keyFlag{key: st.Key, f: f, path: s.keys[st.Key], value: reflect.ValueOf(p).Elem()}
	}
	return fl, nil
}

// Set sets, in the struct ptr points to (of the type given to NewFlags),
// the key of each flag the command line gave, as a file would: a number
// is checked against its field's bounds as a file's is, and 0 is None in
// a field that takes it. A value that cannot be used is an error naming
// the flag and the value: "--drain-timeout 0s: must be positive (leave the
// flag out for the default, 30s)"; the errors of every flag are joined.
func (fl *Flags) Set(ptr any) error {
	v := reflect.ValueOf(ptr).Elem()
	if v.Type() != fl.typ {
		return fmt.Errorf("conf: flags of %v set on a %v", fl.typ, v.Type())
	}
	fl.given = map[string]string{}
	var errs []error
	fl.fs.Visit(func(g *flag.Flag) {
		kf, ok := fl.byName[g.Name]
		if !ok {
			return
		}
		fv := v
		for _, i := range kf.path {
			fv = fv.Field(i)
		}
		fl.given[kf.key] = g.Name
		switch kf.f.kind {
		case kindInt:
			if fv.OverflowInt(kf.value.Int()) {
				errs = append(errs, fmt.Errorf("--%s %d: want a whole number that fits an int", g.Name, kf.value.Int()))
				return
			}
			fv.SetInt(kf.value.Int())
		default:
			fv.Set(kf.value.Convert(fv.Type()))
		}
		switch kf.f.kind {
		case kindInt, kindFloat, kindDuration:
			shown := fmt.Sprint(fv.Interface())
			if why, hint := kf.f.written(fv); why != "" {
				if hint {
					why += kf.f.absentMeans("flag")
				}
				errs = append(errs, fmt.Errorf("--%s %s: %s", g.Name, shown, why))
			}
		}
	})
	return errors.Join(errs...)
}

// Name returns err named by the flag when it is an [*Error] or a
// [*FieldError] of a key that a flag set (in the last Set): "--upstream"
// in place of "upstream:"; any other error as it is.
func (fl *Flags) Name(err error) error {
	var e *Error
	if errors.As(err, &e) {
		if name, ok := fl.given[e.Path]; ok {
			return fmt.Errorf("--%s %w", name, e.Err)
		}
		return err
	}
	var fe *FieldError
	if errors.As(err, &fe) {
		if name, ok := fl.given[fe.Key]; ok {
			return fmt.Errorf("--%s %v: %s", name, fe.Value, fe.Why)
		}
	}
	return err
}
