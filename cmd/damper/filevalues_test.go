package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/damper-ai/damper-go/internal/redistest"
)

// urlSecret stands for a password or token written into a URL.
const urlSecret = "Zq9urlsecretz"

func TestMaskURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"https://api.anthropic.com", "https://api.anthropic.com"},
		{"https://api.anthropic.com/v1/", "https://api.anthropic.com/v1/"},
		{"redis://127.0.0.1:6379/0?password=" + urlSecret, "redis://127.0.0.1:6379/0?password=xxxxx"},
		{"redis://u:" + urlSecret + "@h:6379/0?a=1&b=" + urlSecret + "&" + urlSecret, "redis://xxxxx@h:6379/0?a=xxxxx&b=xxxxx&xxxxx"},
		{"rediss://:" + urlSecret + "@h:6379", "rediss://xxxxx@h:6379"},
		{"u:" + urlSecret + "@h:6379", "xxxxx@h:6379"},
		{"http://u:p/" + urlSecret + "@h/", "http://xxxxx@h/"}, // not a URL to url.Parse: masked all the same
		{"http://h/?k=v#" + urlSecret, "http://h/?k=xxxxx#xxxxx"},
		{"http://h/?", "http://h/?"},
		{"http://h:1/%zz?k=%zz", "http://h:1/%zz?k=xxxxx"},
		{"redis://a?:" + urlSecret + "@h?k=v", "redis://a?xxxxx=xxxxx"}, // a '?' in the user information
		{"", ""},
		{"https://h/" + strings.Repeat("p", 200), "https://h/" + strings.Repeat("p", maxShownURL-len("https://h/")) + "..."},
	} {
		if got := maskURL(tc.in); got != tc.want {
			t.Errorf("maskURL(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	if got, want := scrubQueryValues(`redis: invalid dial_timeout duration: time: invalid duration "`+urlSecret+`"`, "redis://h?dial_timeout="+urlSecret),
		`redis: invalid dial_timeout duration: time: invalid duration "xxxxx"`; got != want {
		t.Errorf("scrubQueryValues: %q, want %q", got, want)
	}
}

// FuzzMaskURL: whatever surrounds them, a URL's password and its query
// values never show through maskURL, which never panics and stays
// bounded.
func FuzzMaskURL(f *testing.F) {
	f.Add("redis", "u", "127.0.0.1:6379/0", "password", "", "")
	f.Add("https", "", "api.anthropic.com", "key", "&x=1", "frag")
	f.Add("", "a@b", "h?x", "k&j", "#", "")
	f.Add("redis://", "a/b", "h@i", "=", "?", "%zz")
	f.Fuzz(func(t *testing.T, scheme, user, host, key, more, frag string) {
		for _, s := range []string{scheme, user, host, key, more, frag} {
			if strings.Contains(s, "Z") { // the secret's own letter marks where it is
				return
			}
		}
		raw := scheme + "://" + user + ":" + urlSecret + "@" + host + "?" + key + "=" + urlSecret + more + "#" + frag
		out := maskURL(raw)
		if strings.Contains(out, urlSecret) || strings.Contains(shownURL(raw), urlSecret) {
			t.Fatalf("maskURL(%q) = %q shows the secret", raw, out)
		}
		if len(out) > maxShownURL+len("...") {
			t.Fatalf("maskURL(%q): %d bytes", raw, len(out))
		}
		// Any string at all, the secret where the user or a value goes.
		_ = maskURL(scheme + user + host + key + more + frag)
	})
}

// TestURLsShownMasked: the URLs of the proxy's file (the store's url and
// address, a backend's base_url, the upstream, from the file and the
// flag), and the HTTP proxy of the environment, never show a password or
// a query value in an error.
func TestURLsShownMasked(t *testing.T) {
	cloudEnv(t, false)
	for _, tc := range []struct{ file, want string }{
		{"store: {url: 'redis://127.0.0.1:6379/0?password=" + urlSecret + "'}\n", `store.url: "redis://127.0.0.1:6379/0?password=xxxxx": redis: unexpected option: password`},
		{"store: {url: 'redis://127.0.0.1:6379/0?dial_timeout=" + urlSecret + "'}\n", `store.url: "redis://127.0.0.1:6379/0?dial_timeout=xxxxx": redis: invalid dial_timeout duration: time: invalid duration "xxxxx"`},
		{"store: {url: 'redis://127.0.0.1:6379/0?pool_size=" + urlSecret + "'}\n", `store.url: "redis://127.0.0.1:6379/0?pool_size=xxxxx": redis: invalid pool_size number: strconv.Atoi: parsing "xxxxx": invalid syntax`},
		{"store: {url: 'redis://u:" + urlSecret + "@h:1?a=" + urlSecret + "'}\n", `store.url: "redis://xxxxx@h:1?a=xxxxx": holds a password`},
		{"store: {url: 'rediss://h:6379?skip_verify=" + urlSecret + "'}\n", `store.url: "rediss://h:6379?skip_verify=xxxxx": skip_verify is not taken`},
		{"store: {address: 'redis://:" + urlSecret + "@h:6379'}\n", `store.address: "redis://xxxxx@h:6379": want host:port`},
		{"backends: [{name: b, provider: bedrock, region: us-east-1, base_url: 'https://h?key=" + urlSecret + "'}]\n", `base_url: "https://h?key=xxxxx": a base URL has no query or fragment`},
		{"backends: [{name: b, provider: bedrock, region: us-east-1, base_url: 'https://u:" + urlSecret + "@h'}]\n", `base_url: "https://xxxxx@h": a base URL holds no credentials`},
		{"upstream: 'https://api.anthropic.com/?key=" + urlSecret + "'\n", `upstream: "https://api.anthropic.com/?key=xxxxx": a base URL has no query or fragment`},
		{"upstream: 'https://u:" + urlSecret + "@api.anthropic.com'\n", `upstream: "https://xxxxx@api.anthropic.com": a base URL holds no credentials`},
		{"upstream: 'ftp://h/#" + urlSecret + "'\n", `upstream: "ftp://h/#xxxxx": want an http or https URL`},
	} {
		_, err := parseProxyFile(t, tc.file)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), urlSecret) {
			t.Errorf("%s: error %v, want %s, without the secret", tc.file, err, tc.want)
		}
	}

	var stderr bytes.Buffer
	code := run([]string{"proxy", "-upstream", "https://api.anthropic.com?key=" + urlSecret}, io.Discard, &stderr)
	if want := `damper proxy: --upstream "https://api.anthropic.com?key=xxxxx": a base URL has no query or fragment`; code != exitUsage || !strings.Contains(stderr.String(), want) || strings.Contains(stderr.String(), urlSecret) {
		t.Errorf("--upstream with a query: exit %d, %s; want %s", code, stderr.String(), want)
	}

	// An HTTP proxy's URL the transport cannot read: its error repeats it.
	checks := testChecks()
	checks.proxy = func(*http.Request) (*url.URL, error) {
		return nil, fmt.Errorf("invalid proxy address %q: bad", "http://u:"+urlSecret+"@%zz")
	}
	err := checks.run(t.Context(), "https://api.anthropic.com", nil)
	if want := "upstream: the HTTP proxy for api.anthropic.com:443: the proxy URL in HTTPS_PROXY or HTTP_PROXY is not valid"; err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), urlSecret) {
		t.Errorf("an HTTP proxy that is not a URL: %v, want %s", err, want)
	}
}

// TestStoreURLNotInLogsOrMetrics: a store url's query values are in
// neither the proxy's log lines nor its /metrics.
func TestStoreURLNotInLogsOrMetrics(t *testing.T) {
	needRedis(t)
	cloudEnv(t, false)
	rds := redistest.Start(t)
	api := fakeAPI(t)
	p := startProxyProcess(t, "masked", "listen: 127.0.0.1:0\nupstream: "+api.URL()+
		"\nstore: {url: 'redis://"+rds.Addr+"/0?client_name="+urlSecret+"', timeout: 1s}\n")
	res, _ := callThrough(t, p.url, "overloaded")
	if res.StatusCode != 200 {
		t.Fatalf("a call: %d", res.StatusCode)
	}
	code, metrics := get(t, p.url+"/metrics")
	if code != 200 || !strings.Contains(metrics, "damper_") || strings.Contains(metrics, urlSecret) {
		t.Errorf("/metrics: %d, %d bytes, the query value in it: %v", code, len(metrics), strings.Contains(metrics, urlSecret))
	}
	if logs := p.logs.String(); !strings.Contains(logs, `"store":"redis at `+rds.Addr) || strings.Contains(logs, urlSecret) {
		t.Errorf("the logs lack the store, or show its url's query value:\n%s", logs)
	}
}
