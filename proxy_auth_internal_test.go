package damper

import (
	"crypto/sha256"
	"net/http"
	"strings"
	"testing"
)

// TestClientKeysCompareEveryHash: a key is compared with every configured
// hash, whether it matches the first, the last or none, so that the time
// taken does not tell which.
func TestClientKeysCompareEveryHash(t *testing.T) {
	var tenants []Tenant
	for _, name := range []string{"a", "b", "c"} {
		tenants = append(tenants, Tenant{Name: name, KeySHA256: []string{ClientKeyHash(name + "-1"), ClientKeyHash(name + "-2")}})
	}
	k, err := newClientKeys(tenants)
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]int{"a-1": 0, "a-2": 0, "b-1": 1, "c-2": 2, "d-1": -1, "": -1} {
		got, compared := k.match(sha256.Sum256([]byte(key)))
		if got != want || compared != 6 {
			t.Errorf("%q: tenant %d after %d comparisons, want %d after 6", key, got, compared, want)
		}
	}
}

// TestPresentedKeyBounds: a key past maxClientKeyBytes is refused before
// it is hashed; at the bound it is taken.
func TestPresentedKeyBounds(t *testing.T) {
	at := strings.Repeat("k", maxClientKeyBytes)
	if key, err := presentedKey(http.Header{"X-Api-Key": {at}}); err != nil || key != at {
		t.Errorf("a key of %d bytes: %v", maxClientKeyBytes, err)
	}
	for _, h := range []http.Header{{"X-Api-Key": {at + "k"}}, {"Authorization": {"Bearer " + at + "k"}}} {
		if _, err := presentedKey(h); err == nil || !strings.Contains(err.Error(), "at most 256 bytes") || strings.Contains(err.Error(), at) {
			t.Errorf("a key of %d bytes: %v", maxClientKeyBytes+1, err)
		}
	}
}

// FuzzPresentedKey: whatever x-api-key and authorization hold, reading
// them never panics, a key read is what one of them holds, within the
// bound, and an error never shows either.
func FuzzPresentedKey(f *testing.F) {
	f.Add("dk-abc", "")
	f.Add("", "Bearer dk-abc")
	f.Add("dk-abc", "bearer   dk-abc")
	f.Add("dk-abc", "Basic x")
	f.Add("", "Bearer")
	f.Add("", "Bearer ")
	f.Add(strings.Repeat("x", 300), "")
	f.Fuzz(func(t *testing.T, apiKey, auth string) {
		h := http.Header{}
		if apiKey != "" {
			h.Set("X-Api-Key", apiKey)
		}
		if auth != "" {
			h.Set("Authorization", auth)
		}
		key, err := presentedKey(h)
		if err != nil {
			for _, s := range []string{apiKey, auth} {
				if len(s) >= 8 && strings.Contains(err.Error(), s) {
					t.Fatalf("the error shows a credential: %v", err)
				}
			}
			return
		}
		_, token, _ := strings.Cut(auth, " ")
		if key == "" || len(key) > maxClientKeyBytes || key != apiKey && key != strings.TrimLeft(token, " ") {
			t.Fatalf("x-api-key %q, authorization %q: key %q", apiKey, auth, key)
		}
	})
}
