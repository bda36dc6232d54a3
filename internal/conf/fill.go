package conf

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
)

// FieldError is a field whose value cannot be used.
type FieldError struct {
	// Field is the field's path in Go below the filled-in struct:
	// "Breaker.OpenFor", `RateLimit.Limits["claude-sonnet-4"]`.
	Field string
	// Key is the same path in a file: "breaker.open_for".
	Key   string
	Value any
	// Why says what the value must be, to a Go caller; FileWhy to a file's
	// writer.
	Why, FileWhy string
	// Default: the value is the field's default, not given.
	Default bool
}

// Text is a value a FieldError shows as it is, in Go and in a file.
type Text string

func (e *FieldError) Error() string {
	return fmt.Sprintf("%s = %v: %s", e.Field, e.Value, e.Why)
}

// FileError returns the error as a file's reader sees it: the value as a
// file writes it, and what it must be.
func (e *FieldError) FileError() error {
	written := render(e.Value)
	if e.Default {
		written += " (the default)"
	}
	why := e.FileWhy
	if why == "" {
		why = e.Why
	}
	return fmt.Errorf("%s: %s", written, why)
}

// render writes v as a file writes it, for a message.
func render(v any) string {
	switch v := v.(type) {
	case Text:
		return string(v)
	case time.Duration:
		return strconv.Quote(v.String())
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64)
	case string:
		return strconv.Quote(v)
	case []string:
		b, _ := json.Marshal(v)
		return string(b)
	}
	return fmt.Sprint(v)
}

// at is where the walk is: a field's path in Go and in a file.
type at struct{ field, key string }

func (a at) child(f *field) at {
	return at{joinPath(a.field, f.name), joinPath(a.key, f.key)}
}

func (a at) entry(k string) at {
	return at{fmt.Sprintf("%s[%q]", a.field, k), joinPath(a.key, k)}
}

// index is the path of a list's i-th element, as a file's decoding names
// it too: "backends[1]".
func (a at) index(i int) at {
	return at{fmt.Sprintf("%s[%d]", a.field, i), fmt.Sprintf("%s[%d]", a.key, i)}
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// Defaults returns v filled in by Fill: for a zero value, every field's
// default as its tag declares it. It panics when Fill fails, which for a
// zero value means a tag that contradicts itself, a bug a test catches.
func Defaults[T any](v T) T {
	if err := Fill(&v); err != nil {
		panic(err)
	}
	return v
}

// Fill fills in the struct ptr points to: it checks every field against
// its bounds, sets each zero field to its default and each None to 0, and
// runs the registered checks. The pointers, maps and slices it holds are
// replaced by copies, so that the filled-in struct shares nothing with the
// one given. Its error is a [*FieldError] for the first field, in
// declaration order, that cannot be used.
func Fill(ptr any) error {
	return fill(reflect.ValueOf(ptr).Elem(), at{}, nil)
}

// read is what a file's decoding found: the keys it had, and the first
// error of each value, by the key's path. A value's error waits for the
// walk of fill, so that the first error reported is the first in the
// struct's order, whatever the order of the file (YAML's keys reach JSON
// sorted).
type read struct {
	present map[string]bool
	bad     map[string]error
}

// fill fills v; file, when v was read from a file, is what the reading
// found.
func fill(v reflect.Value, a at, file *read) error {
	s, err := schemaOf(v.Type())
	if err != nil {
		return err
	}
	var given reflect.Value
	if s.check != nil {
		given = reflect.New(s.typ).Elem()
		given.Set(v)
	}
	for _, f := range s.fields {
		fv := v.Field(f.index)
		fa := a.child(f)
		if file != nil && f.kind != kindInline && file.bad[fa.key] != nil {
			return file.bad[fa.key]
		}
		switch f.kind {
		case kindSkip, kindBool:
		case kindString:
			if fv.String() == "" && f.def.IsValid() {
				fv.Set(f.def)
			}
			if v := fv.String(); len(f.enum) > 0 && !slices.Contains(f.enum, v) {
				return &FieldError{Field: fa.field, Key: fa.key, Value: Text(quoteCut(v)), Why: "must be " + quoteList(f.enum)}
			}
		case kindInline:
			if err := fill(fv, a, file); err != nil {
				return err
			}
		case kindInt, kindFloat, kindDuration:
			if number(fv) == 0 {
				if f.def.IsValid() {
					fv.Set(f.def)
				}
				continue
			}
			if f.none != "" && number(fv) == None {
				fv.SetZero()
				continue
			}
			if why := f.outside(fv); why != "" {
				return f.fieldError(fa, fv.Interface(), why, file)
			}
		case kindEnum:
			if why := f.outside(fv); why != "" {
				return &FieldError{Field: fa.field, Key: fa.key, Value: fv.Interface(), Why: why}
			}
		case kindStructPtr:
			if fv.IsNil() {
				continue
			}
			c := reflect.New(f.typ.Elem())
			c.Elem().Set(fv.Elem())
			if err := fill(c.Elem(), fa, file); err != nil {
				return err
			}
			fv.Set(c)
		case kindMap:
			if why := f.outside(fv); why != "" {
				return &FieldError{Field: fa.field, Key: fa.key, Value: Text(fmt.Sprintf("%d %s", fv.Len(), f.unit)), Why: why}
			}
			if fv.IsNil() {
				continue
			}
			c := reflect.MakeMapWithSize(f.typ, fv.Len())
			for _, k := range sortedKeys(fv) {
				e := reflect.New(f.typ.Elem()).Elem()
				e.Set(fv.MapIndex(reflect.ValueOf(k)))
				switch f.typ.Elem().Kind() {
				case reflect.Struct:
					if err := fill(e, fa.entry(k), file); err != nil {
						return err
					}
				case reflect.Slice:
					e.Set(cloneSlice(e))
				}
				c.SetMapIndex(reflect.ValueOf(k).Convert(f.typ.Key()), e)
			}
			fv.Set(c)
		case kindSlice:
			if why := f.outside(fv); why != "" {
				return &FieldError{Field: fa.field, Key: fa.key, Value: Text(fmt.Sprintf("%d %s", fv.Len(), f.unit)), Why: why}
			}
			fv.Set(cloneSlice(fv))
			if f.typ.Elem().Kind() == reflect.Struct { // each element is filled in as a struct of its own
				for i := range fv.Len() {
					if err := fill(fv.Index(i), fa.index(i), file); err != nil {
						return err
					}
				}
			}
		}
	}
	if s.check == nil {
		return nil
	}
	err = s.check(v, given)
	if fe, ok := err.(*FieldError); ok {
		return s.place(fe, a, file)
	}
	return err
}

// fieldError is the error of field f at a, whose value v is outside its
// bounds.
func (f *field) fieldError(a at, v any, why string, file *read) *FieldError {
	if why == f.above() && !f.interval { // no word on 0
		return &FieldError{Field: a.field, Key: a.key, Value: v, Why: why, Default: file.absent(a.key)}
	}
	return &FieldError{Field: a.field, Key: a.key, Value: v, Why: why + f.zeroMeans(), FileWhy: why + f.absentMeans("key"), Default: file.absent(a.key)}
}

// place completes a check's error, whose Field names a field of s, with
// its paths from the root and, for a file, its key and the names of the
// fields its message names.
func (s *schema) place(fe *FieldError, a at, file *read) *FieldError {
	if fe.Key != "" || fe.Field == "" { // placed by an inner check
		return fe
	}
	name, rest := fe.Field, ""
	if i := strings.IndexAny(name, ".["); i >= 0 {
		name, rest = name[:i], name[i:]
	}
	key := name
	why := fe.Why
	byLength := slices.Clone(s.fields) // "MaxOpenFor (" before "OpenFor ("
	slices.SortFunc(byLength, func(a, b *field) int { return len(b.name) - len(a.name) })
	for _, f := range byLength {
		if f.name == name {
			key = f.key
		}
		if f.kind != kindSkip && f.kind != kindInline {
			why = strings.ReplaceAll(why, f.name+" (", f.key+" (")
		}
	}
	c := *fe
	c.Field = joinPath(a.field, fe.Field)
	c.Key = joinPath(a.key, key) + keyRest(rest)
	c.FileWhy = why
	_, isText := fe.Value.(Text)
	c.Default = !isText && rest == "" && file.absent(c.Key)
	return &c
}

// keyRest turns the rest of a Go path, `["claude-a"].RequestsPerMinute`,
// into a file's, ".claude-a.RequestsPerMinute"; a check names map entries
// only, so a field after one keeps its Go name.
func keyRest(rest string) string {
	var b strings.Builder
	for rest != "" {
		if strings.HasPrefix(rest, "[") {
			end := strings.Index(rest, "]")
			if end < 0 {
				break
			}
			k, err := strconv.Unquote(rest[1:end])
			if err != nil {
				k = rest[1:end]
			}
			b.WriteString("." + k)
			rest = rest[end+1:]
			continue
		}
		b.WriteString(rest)
		break
	}
	return b.String()
}

func sortedKeys(m reflect.Value) []string {
	keys := make([]string, 0, m.Len())
	for it := m.MapRange(); it.Next(); {
		keys = append(keys, it.Key().String())
	}
	slices.Sort(keys)
	return keys
}

func cloneSlice(v reflect.Value) reflect.Value {
	if v.IsNil() {
		return v
	}
	c := reflect.MakeSlice(v.Type(), v.Len(), v.Len())
	reflect.Copy(c, v)
	return c
}

// absent reports whether a file was read and did not have key.
func (r *read) absent(key string) bool { return r != nil && !r.present[key] }

// quoteCut quotes a string value for an error: its first 64 bytes.
func quoteCut(s string) string {
	if len(s) <= 64 {
		return strconv.Quote(s)
	}
	return strconv.Quote(s[:64]) + "..."
}
