package conf

import (
	"fmt"
	"reflect"
	"time"
)

// Check reads the declaration of struct type t and of every struct it
// holds (through a pointer, a map, a list or an embedding): it fails on a field
// with no key tag, a tag that does not parse, a default outside its
// field's bounds, and a number, duration, map or list with no max (in or
// max tag), since every value a file gives becomes memory or time.
func Check(t reflect.Type) error {
	s, err := schemaOf(t)
	if err != nil {
		return err
	}
	for _, f := range s.fields {
		switch f.kind {
		case kindInt, kindFloat, kindDuration, kindMap, kindSlice:
			if !f.hasHi {
				return fmt.Errorf("conf: %s.%s: no max: every number, duration, map and list needs an upper bound", t.Name(), f.name)
			}
		}
		var inner reflect.Type
		switch f.kind {
		case kindStructPtr:
			inner = f.typ.Elem()
		case kindInline:
			inner = f.typ
		case kindMap, kindSlice:
			if f.typ.Elem().Kind() == reflect.Struct {
				inner = f.typ.Elem()
			}
		}
		if inner != nil {
			if err := Check(inner); err != nil {
				return err
			}
		}
	}
	return nil
}

// Sample sets every field of the struct ptr points to that a file holds
// to a value other than its default and inside its bounds (its largest,
// or one above its least), sub-structs included, and each map to one
// entry; with none, every field that takes None to None. It is for tests:
// a Policy so set, written and read back, must come back the same.
func Sample(ptr any, none bool) error {
	return sample(reflect.ValueOf(ptr).Elem(), none)
}

func sample(v reflect.Value, none bool) error {
	s, err := schemaOf(v.Type())
	if err != nil {
		return err
	}
	for _, f := range s.fields {
		fv := v.Field(f.index)
		switch f.kind {
		case kindInline:
			if err := sample(fv, none); err != nil {
				return err
			}
		case kindInt, kindFloat, kindDuration:
			if none && f.none != "" {
				setNumber(fv, None)
				continue
			}
			x := 1.0
			switch {
			case f.hasHi && !f.hiExcl:
				x = f.hi
			case f.hasHi:
				x = (f.lo + f.hi) / 2
			case f.hasLo:
				x = f.lo + 1
			}
			if f.kind == kindDuration && x < float64(time.Second) {
				x = float64(time.Second) // a duration of whole units
			}
			if f.def.IsValid() && x == number(f.def) {
				x++ // a default at a bound without the other
			}
			setNumber(fv, x)
		case kindBool:
			fv.SetBool(true)
		case kindString:
			fv.SetString("sample-" + f.key)
			if len(f.enum) > 0 {
				fv.SetString(f.enum[len(f.enum)-1])
			}
		case kindEnum:
			if fv.CanInt() {
				fv.SetInt(int64(len(f.enum) - 1))
			} else {
				fv.SetUint(uint64(len(f.enum) - 1))
			}
		case kindStructPtr:
			c := reflect.New(f.typ.Elem())
			if err := sample(c.Elem(), none); err != nil {
				return err
			}
			fv.Set(c)
		case kindMap:
			m := reflect.MakeMap(f.typ)
			e := reflect.New(f.typ.Elem()).Elem()
			switch e.Kind() {
			case reflect.Struct:
				if err := sample(e, none); err != nil {
					return err
				}
			case reflect.Slice:
				e.Set(reflect.Append(e, reflect.ValueOf("sample-sibling").Convert(e.Type().Elem())))
			case reflect.String:
				e.SetString("sample-value")
			}
			m.SetMapIndex(reflect.ValueOf("sample-"+f.key).Convert(f.typ.Key()), e)
			fv.Set(m)
		case kindSlice:
			e := reflect.New(f.typ.Elem()).Elem()
			if e.Kind() == reflect.Struct {
				if err := sample(e, none); err != nil {
					return err
				}
			} else {
				e.Set(reflect.ValueOf("sample").Convert(e.Type()))
			}
			fv.Set(reflect.Append(reflect.MakeSlice(f.typ, 0, 1), e))
		case kindSkip:
		default:
			return fmt.Errorf("conf: no sample for %v", f.typ)
		}
	}
	return nil
}

func setNumber(v reflect.Value, x float64) {
	if v.Kind() == reflect.Float64 {
		v.SetFloat(x)
	} else {
		v.SetInt(int64(x))
	}
}
