package main

import (
	"crypto/rand"
	"encoding/base64"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/conf"
)

// The proxy's clients: the file's tenants list, each a name and its keys,
// as hashes (key_sha256) or environment variables that hold them
// (key_env), and the operator's upstream key (upstream_api_key_env); and
// damper key, which makes a key and its hash.

// tenantFile is one entry of the file's tenants list: a damper.Tenant
// (name, key_sha256) and the environment variables whose keys it adds.
type tenantFile struct {
	damper.Tenant `key:",inline"`
	// KeyEnv names environment variables, each holding one of the
	// tenant's keys: read and hashed at start, never logged.
	KeyEnv []string `key:"key_env" max:"16" unit:"variables"`
}

// The library's bounds of a tenant, as damper.Tenant states them: the
// command checks key_env's keys, which the library sees only hashed.
const (
	maxTenantKeys     = 16
	maxClientKeyBytes = 256
)

func init() { conf.Register(checkTenantFile) }

// checkTenantFile checks key_env's names and variables, and that the
// tenant has a key.
func checkTenantFile(t *tenantFile, _ tenantFile) error {
	for i, name := range t.KeyEnv {
		field := "KeyEnv"
		switch {
		case checkEnvName(name) != nil:
			// Not shown: it may be the key itself, written where its
			// variable's name goes.
			return &conf.FieldError{Field: field, Value: conf.Text("(not shown)"), Why: fmt.Sprintf("entry %d: want the name of the environment variable that holds the key, not the key: at most %d letters, digits or '_', not starting with a digit", i, maxEnvName)}
		case os.Getenv(name) == "":
			return &conf.FieldError{Field: field, Value: name, Why: fmt.Sprintf("entry %d: the environment variable is unset or empty: it must hold one of the tenant's keys", i)}
		case len(os.Getenv(name)) > maxClientKeyBytes:
			return &conf.FieldError{Field: field, Value: name, Why: fmt.Sprintf("entry %d: the variable holds %d bytes: a client key has at most %d", i, len(os.Getenv(name)), maxClientKeyBytes)}
		}
	}
	switch n := len(t.KeySHA256) + len(t.KeyEnv); {
	case n == 0:
		return &conf.FieldError{Field: "KeyEnv", Value: conf.Text("nothing, and no key_sha256"), Why: "a tenant needs a key: key_sha256 (damper key makes one) or key_env"}
	case n > maxTenantKeys:
		return &conf.FieldError{Field: "KeyEnv", Value: conf.Text(fmt.Sprintf("%d keys with key_sha256's", n)), Why: fmt.Sprintf("at most %d keys a tenant", maxTenantKeys)}
	}
	return nil
}

// proxyTenants are the tenants of files as the proxy takes them: each
// key_env's key hashed and added to its key_sha256. It checks what no one
// entry can: that no two share a name or a key, and that operator
// credentials (backends, upstream_api_key_env) come with tenants and
// tenants with the operator's upstream key.
func proxyTenants(files []tenantFile, backends []backendFile, upstreamKeyEnv string) ([]damper.Tenant, string, error) {
	if len(files) == 0 {
		if len(backends) > 0 {
			return nil, "", fmt.Errorf("backends[0] (%q): spends the operator's credentials; name the clients that may use it under tenants", backends[0].Name)
		}
		if upstreamKeyEnv != "" {
			return nil, "", &conf.Error{Path: "upstream_api_key_env", Err: fmt.Errorf("%q: the operator's key is spent only for clients that present a key: name them under tenants", upstreamKeyEnv)}
		}
		return nil, "", nil
	}
	var upstreamKey string
	switch {
	case upstreamKeyEnv == "":
		return nil, "", &conf.Error{Path: "upstream_api_key_env", Err: fmt.Errorf("nothing: required with tenants: the clients present the proxy's keys, and the upstream gets the operator's, from this environment variable")}
	case checkEnvName(upstreamKeyEnv) != nil:
		return nil, "", &conf.Error{Path: "upstream_api_key_env", Err: fmt.Errorf("(not shown): want the name of the environment variable that holds the key, not the key: at most %d letters, digits or '_', not starting with a digit", maxEnvName)}
	default:
		if upstreamKey = os.Getenv(upstreamKeyEnv); upstreamKey == "" {
			return nil, "", &conf.Error{Path: "upstream_api_key_env", Err: fmt.Errorf("%q: the environment variable is unset or empty: it must hold the operator's API key for the upstream", upstreamKeyEnv)}
		}
	}
	out := make([]damper.Tenant, len(files))
	names := map[string]int{}
	hashes := map[string]int{}
	for i, f := range files {
		if j, ok := names[f.Name]; ok {
			return nil, "", &conf.Error{Path: fmt.Sprintf("tenants[%d].name", i), Err: fmt.Errorf("%q: tenants[%d] has this name already", f.Name, j)}
		}
		names[f.Name] = i
		t := f.Tenant
		t.KeySHA256 = make([]string, 0, len(f.KeySHA256)+len(f.KeyEnv))
		for _, h := range f.KeySHA256 {
			t.KeySHA256 = append(t.KeySHA256, lowerHex(h))
		}
		for _, name := range f.KeyEnv {
			t.KeySHA256 = append(t.KeySHA256, damper.ClientKeyHash(os.Getenv(name)))
		}
		for k, h := range t.KeySHA256 {
			if j, ok := hashes[h]; ok {
				return nil, "", &conf.Error{Path: fmt.Sprintf("tenants[%d]", i), Err: fmt.Errorf("key %d: tenants[%d] (%q) has this key already: a key names one tenant", k, j, files[j].Name)}
			}
			hashes[h] = i
		}
		out[i] = t
	}
	return out, upstreamKey, nil
}

// lowerHex is h, hexadecimal digits, in lower case.
func lowerHex(h string) string {
	b := []byte(h)
	for i, c := range b {
		if 'A' <= c && c <= 'F' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// keyPrefix starts every key damper key makes, so that one is known for
// what it is in a leak scanner's eyes and the proxy's logs never hold one.
const keyPrefix = "dk-"

// newClientKey is a new client key: keyPrefix and 32 random bytes,
// base64url.
func newClientKey() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return keyPrefix + base64.RawURLEncoding.EncodeToString(b[:])
}

func runKey(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("key", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: damper key

Prints a new random client key for the proxy, and the key_sha256 line that
names it in a tenant of the proxy's file. Give the key to the tenant's
clients (their SDK's apiKey, or ANTHROPIC_API_KEY) and keep only the hash
in the file; or put the key in a secret and name its environment variable
under key_env.

To rotate a key: add the new key's hash to the tenant's key_sha256 (a
tenant holds up to 16), reload the proxies (SIGHUP), move the clients to
the new key, then remove the old hash and reload again.
`)
	}
	if err := parseFlags(fs, args, stdout, stderr); err != nil {
		code, _ := badFlags("key", err, stderr)
		return code
	}
	if fs.NArg() > 0 {
		fs.Usage()
		fmt.Fprintf(stderr, "damper key: takes no arguments, got %q\n", fs.Args())
		return exitUsage
	}
	key := newClientKey()
	fmt.Fprintf(stdout, "key: %s\nkey_sha256: [%q]\n", key, damper.ClientKeyHash(key))
	return exitOK
}
