package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/damper-ai/damper-go/dampertest"
)

// get answers a GET of url: its status and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// withAdmin gives the proxy an admin listener on a free loopback port,
// and returns its base URL.
func withAdmin(t *testing.T, s *proxySettings) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.AdminListen, s.adminLn = ln.Addr().String(), ln
	return "http://" + ln.Addr().String()
}

// TestProxyAdminListener: with admin_listen, /healthz, /readyz and
// /metrics are served there, the metrics Damper's after a call through
// the API's listener; the API's listener answers them 404 in the API's
// shape, whatever the method, and sends none upstream.
func TestProxyAdminListener(t *testing.T) {
	srv := fakeAPI(t)
	var admin string
	p := startProxy(t, srv.URL(), func(s *proxySettings) {
		s.Name = "admin-test"
		admin = withAdmin(t, s)
	})
	res, _ := callThrough(t, p.url, "overloaded")
	if res.StatusCode != 200 || srv.Count("overloaded") != 2 {
		t.Fatalf("a call through the API's listener: %d, %d attempts", res.StatusCode, srv.Count("overloaded"))
	}

	if code, body := get(t, admin+"/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("admin /healthz: %d %q", code, body)
	}
	if code, body := get(t, admin+"/readyz"); code != 200 || body != "ready\n" {
		t.Errorf("admin /readyz: %d %q", code, body)
	}
	code, body := get(t, admin+"/metrics")
	for _, want := range []string{
		`damper_attempts_total{damper_attempt_error_class="overloaded",damper_name="admin-test",damper_provider="anthropic"`,
		`damper_request_duration_seconds_count{damper_name="admin-test",damper_outcome="success"`,
		"go_goroutines",
	} {
		if code != 200 || !strings.Contains(body, want) {
			t.Errorf("admin /metrics (%d) has no %s", code, want)
		}
	}
	if code, _ := get(t, admin+"/v1/models"); code != 404 {
		t.Errorf("admin /v1/models: %d, want 404: the admin listener serves nothing else", code)
	}

	before := len(srv.Requests())
	for _, path := range []string{"/metrics", "/healthz", "/readyz"} {
		for _, method := range []string{http.MethodGet, http.MethodHead, http.MethodPost} {
			req, _ := http.NewRequest(method, p.url+path, nil)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != 404 || res.Header.Get("X-Should-Retry") != "false" {
				t.Errorf("%s %s on the API's listener: %d %v", method, path, res.StatusCode, res.Header)
			}
			if method == http.MethodHead {
				continue
			}
			var e struct {
				Type  string `json:"type"`
				Error struct {
					Type    string `json:"type"`
					Message string `json:"message"`
				} `json:"error"`
			}
			if err := json.Unmarshal(b, &e); err != nil || e.Type != "error" || e.Error.Type != "not_found_error" || !strings.Contains(e.Error.Message, path) {
				t.Errorf("%s %s on the API's listener: %s (%v)", method, path, b, err)
			}
		}
	}
	if reqs := srv.Requests(); len(reqs) != before {
		t.Errorf("the upstream got %d requests for the admin paths: %+v", len(reqs)-before, reqs[before:])
	}
	// Any other path still passes through.
	if code, _ := get(t, p.url+"/v1/models"); code != 404 || len(srv.Requests()) != before+1 {
		t.Errorf("/v1/models: %d, %d requests upstream, want the fake API's 404", code, len(srv.Requests())-before)
	}
}

// TestProxyWithoutAdminListener: without admin_listen, the API's listener
// serves /healthz, /readyz and /metrics itself, as before, and a POST to
// them, which no probe makes, passes through.
func TestProxyWithoutAdminListener(t *testing.T) {
	srv := fakeAPI(t)
	p := startProxy(t, srv.URL(), nil)
	for path, want := range map[string]string{"/healthz": "ok\n", "/readyz": "ready\n", "/metrics": "go_goroutines"} {
		if code, body := get(t, p.url+path); code != 200 || !strings.Contains(body, want) {
			t.Errorf("%s: %d %.100q", path, code, body)
		}
	}
	if len(srv.Requests()) != 0 {
		t.Errorf("the upstream got %d requests", len(srv.Requests()))
	}
	res, err := http.Post(p.url+"/metrics", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if reqs := srv.Requests(); len(reqs) != 1 || reqs[0].Path != "/metrics" {
		t.Errorf("POST /metrics: the upstream got %+v", reqs)
	}
}

// TestProxyAdminDrains: the admin listener answers through the drain, with
// /readyz at 503, while the API's listener accepts no more, and is closed
// once the proxy has stopped.
func TestProxyAdminDrains(t *testing.T) {
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		st := dampertest.Stream{Text: "drained"}
		for i, e := range st.Events() {
			if i == st.ContentIndex()+1 {
				select {
				case <-release:
				case <-r.Context().Done():
					return
				}
			}
			io.WriteString(w, e.String())
			w.(http.Flusher).Flush()
		}
	}))
	defer up.Close()
	var admin string
	p := startProxy(t, up.URL, func(s *proxySettings) { admin = withAdmin(t, s) })

	req, _ := http.NewRequest(http.MethodPost, p.url+"/v1/messages",
		strings.NewReader(`{"model":"claude-sonnet-4-6","max_tokens":64,"stream":true,"messages":[]}`))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	br := bufio.NewReader(res.Body)
	for { // up to the first content: the stream is in flight
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(line, "content_block_delta") {
			break
		}
	}
	p.stop()
	deadline := time.Now().Add(10 * time.Second)
	for { // the drain has begun once the API's listener refuses
		conn, err := net.Dial("tcp", strings.TrimPrefix(p.url, "http://"))
		if err != nil {
			break
		}
		conn.Close()
		if time.Now().After(deadline) {
			t.Fatal("the API's listener still accepts while the proxy drains")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if code, body := get(t, admin+"/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("admin /readyz during the drain: %d %q, want 503", code, body)
	}
	if code, _ := get(t, admin+"/healthz"); code != 200 {
		t.Errorf("admin /healthz during the drain: %d", code)
	}
	if code, body := get(t, admin+"/metrics"); code != 200 || !strings.Contains(body, "go_goroutines") {
		t.Errorf("admin /metrics during the drain: %d", code)
	}
	close(release)
	if rest, err := io.ReadAll(br); err != nil || !strings.HasSuffix(string(rest), "data: {\"type\":\"message_stop\"}\n\n") {
		t.Errorf("the drained stream ended with %v: %q", err, rest)
	}
	err = <-p.done
	p.done <- err // for the cleanup
	if conn, err := net.Dial("tcp", strings.TrimPrefix(admin, "http://")); err == nil {
		conn.Close()
		t.Error("the admin listener still accepts once the proxy has stopped")
	}
}

// TestProxyAdminListenFails: an admin_listen that cannot be listened on
// stops the proxy at start, with an error naming it.
func TestProxyAdminListenFails(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	// An upstream on loopback, which the start's checks reach.
	upstream := httptest.NewServer(http.NotFoundHandler())
	defer upstream.Close()
	path := filepath.Join(t.TempDir(), "proxy.yaml")
	if err := os.WriteFile(path, []byte("listen: 127.0.0.1:0\nupstream: "+upstream.URL+"\nadmin_listen: "+taken.Addr().String()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var errb bytes.Buffer
	if code := run([]string{"proxy", "-config", path}, io.Discard, &errb); code != exitFail ||
		!strings.Contains(errb.String(), `"admin_listen":"`+taken.Addr().String()+`"`) || !strings.Contains(errb.String(), "address already in use") {
		t.Errorf("a taken admin_listen: exit %d, %s", code, errb.String())
	}
}

// TestProxyAdminBeyondLoopbackWarns: an admin_listen that other hosts
// reach gets a warning at start, as a listen address does; a loopback
// one gets none.
func TestProxyAdminBeyondLoopbackWarns(t *testing.T) {
	srv := fakeAPI(t)
	for addr, warns := range map[string]bool{
		"0.0.0.0:9464": true, ":9464": true, "10.1.2.3:9464": true, "[::]:9464": true, "metrics.internal:9464": true,
		"127.0.0.1:9464": false, "127.8.8.8:9464": false, "localhost:9464": false, "[::1]:9464": false,
	} {
		p := startProxy(t, srv.URL(), func(s *proxySettings) {
			withAdmin(t, s)      // a loopback listener: what is checked is the address configured
			s.AdminListen = addr // as the file gives it
		})
		if code, _ := get(t, p.url+"/v1/models"); code == 0 { // served: the lines at start are written
			t.Fatal("no answer")
		}
		want := `"level":"WARN","msg":"damper proxy: admin listener beyond loopback: other hosts can read /metrics (the models, backends and outcomes of the calls) and /readyz","admin_listen":"` + addr + `"}`
		if got := strings.Contains(p.logs.String(), want); got != warns {
			t.Errorf("admin_listen %s: warned %v, want %v:\n%s", addr, got, warns, p.logs)
		}
	}
}
