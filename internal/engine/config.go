package engine

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/damper-ai/damper-go/internal/conf"
)

// ConfigError is a configuration that cannot be loaded: a document that
// is not JSON or YAML, or a key or value of a Policy file that is wrong.
type ConfigError struct {
	// File is the file read, when [LoadPolicyFile] read one.
	File string
	// Path is the key's path, its parts joined with dots: "max_attempts",
	// "breaker.open_for",
	// "rate_limit.limits.claude-sonnet-4.requests_per_minute". It is empty
	// for an error of the whole document.
	Path string
	// Err says what is wrong, after the value as written when there is one.
	Err error
}

func (e *ConfigError) Error() string {
	var b strings.Builder
	b.WriteString("damper: ")
	if e.File != "" {
		b.WriteString(e.File)
	} else {
		b.WriteString("policy config")
	}
	if e.Path != "" {
		b.WriteString(": ")
		b.WriteString(e.Path)
	}
	b.WriteString(": ")
	b.WriteString(e.Err.Error())
	return b.String()
}

func (e *ConfigError) Unwrap() error { return e.Err }

// configError is err, from package conf, as a *ConfigError.
func configError(err error) error {
	if err == nil {
		return nil
	}
	var ce *conf.Error
	if errors.As(err, &ce) {
		return &ConfigError{Path: ce.Path, Err: ce.Err}
	}
	return &ConfigError{Err: err}
}

// ParsePolicyJSON returns the Policy of a JSON document, with the zero
// value in every field whose key is absent, as [New] expects. null is the
// zero Policy. It checks the values as New does; its error is a
// [*ConfigError].
//
// A Policy file, JSON or YAML, holds the fields of a [Policy] under the
// snake_case keys their declarations name (each field's `key` tag), and
// its parts under theirs:
//
//	max_attempts: 3
//	per_attempt_timeout: 45s
//	retry_budget_ratio: 0      # explicitly zero: the budget never grows
//	retry_budget_min_tokens: 20
//	on_budget_exhausted: passthrough
//	breaker:
//	  failure_ratio: 0.5
//	  open_for: 2s
//	  max_open_for: 10s
//	throttle: {}               # a throttle with its defaults
//	rate_limit:
//	  max_wait: 10s
//	  priority: batch
//	  limits:
//	    claude-sonnet-4: {requests_per_minute: 4000}
//
// A key that is absent means the default, as a zero field of Policy does;
// an absent breaker, throttle, rate_limit, hedge or fallback means none,
// and {} one with its defaults. A value written 0 means zero: in the
// fields that take [None] (retry_budget_ratio, retry_budget_min_tokens,
// backoff_base, max_retry_after, rate_limit.max_wait) it becomes None, in
// the fields where 0 already means something (max_retry_cost_usd and
// stream_idle_timeout: off; the limits: learned; hedge.delay: a quantile)
// it is 0, and in the others, where zero cannot be used, it is an error.
// Durations are strings that [time.ParseDuration] reads ("30s", "1m30s";
// the number 0 is zero too); on_budget_exhausted is "raise" or
// "passthrough", priority "interactive" or "batch". null is not a value:
// leave the key out.
//
// A file cannot hold the Classifier, the PriceTable or the breaker's
// OnStateChange, which are code: set them on the Policy that the file
// gives.
//
// Reading is strict: an unknown or repeated key, a value of the wrong type,
// a bad duration or name, and a value the Policy cannot use are each a
// [*ConfigError] naming the key's path, such as "breaker.open_for", and
// the value.
func ParsePolicyJSON(data []byte) (Policy, error) {
	var p Policy
	if err := conf.DecodeJSON(data, &p); err != nil {
		return Policy{}, configError(err)
	}
	return p, nil
}

// ParsePolicyYAML returns the Policy of a YAML document, as
// [ParsePolicyJSON] does; it reads JSON too, except JSON indented with
// tabs, which YAML does not allow. An empty document is the zero Policy.
// YAML 1.1 reads an unquoted yes, no, on or off as a boolean.
func ParsePolicyYAML(data []byte) (Policy, error) {
	var p Policy
	if err := conf.DecodeYAML(data, &p); err != nil {
		return Policy{}, configError(err)
	}
	return p, nil
}

// LoadPolicyFile returns the Policy of the file name: JSON when its name
// ends in .json, YAML otherwise. An error in the file is a [*ConfigError]
// whose File is name.
func LoadPolicyFile(name string) (Policy, error) {
	data, err := os.ReadFile(name)
	if err != nil {
		return Policy{}, fmt.Errorf("damper: %w", err)
	}
	var p Policy
	if strings.EqualFold(filepath.Ext(name), ".json") {
		p, err = ParsePolicyJSON(data)
	} else {
		p, err = ParsePolicyYAML(data)
	}
	if ce, ok := err.(*ConfigError); ok {
		withFile := *ce
		withFile.File = name
		return Policy{}, &withFile
	}
	return p, err
}

// MarshalJSON writes p as a Policy file holds it, its keys in the order of
// the fields: a zero field is left out (the default), [None] is written
// 0, and what a file cannot hold (the Classifier, the PriceTable, the
// breaker's OnStateChange) is left out. [ParsePolicyJSON] reads it back
// into p; sigs.k8s.io/yaml's Marshal writes the same as YAML. A Policy
// filled in by New (see [Damper.Policy]) has a real 0 where it was given
// None, which a file writes by leaving the key out: write the Policy given
// to New instead.
func (p Policy) MarshalJSON() ([]byte, error) {
	b, err := conf.MarshalJSON(p)
	if err != nil {
		return nil, fmt.Errorf("damper: Policy: %w", err)
	}
	return b, nil
}

// UnmarshalJSON reads a Policy file's JSON into p, as [ParsePolicyJSON]
// does, so that a larger configuration file can hold a Policy; on an
// error, a [*ConfigError] whose Path is relative to the Policy, p is
// unchanged.
func (p *Policy) UnmarshalJSON(data []byte) error {
	q, err := ParsePolicyJSON(data)
	if err != nil {
		return err
	}
	*p = q
	return nil
}
