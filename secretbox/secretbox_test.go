package secretbox

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
)

func newBox(t *testing.T) *Box {
	t.Helper()
	key := make([]byte, KeySize)
	rand.Read(key)
	b, err := New(key)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSealOpen(t *testing.T) {
	b := newBox(t)
	sealed := b.SealString("EAAG-secret-token", "channels.upstream_token:1")
	if bytes.Contains(sealed, []byte("EAAG-secret-token")) {
		t.Fatal("plaintext visible in sealed value")
	}
	got, err := b.OpenString(sealed, "channels.upstream_token:1")
	if err != nil || got != "EAAG-secret-token" {
		t.Fatalf("OpenString = %q, %v", got, err)
	}
	again := b.SealString("EAAG-secret-token", "channels.upstream_token:1")
	if bytes.Equal(sealed, again) {
		t.Fatal("two seals of the same value are equal: nonce not random")
	}
}

func TestOpenRejects(t *testing.T) {
	b := newBox(t)
	sealed := b.SealString("secret", "a:1")
	if _, err := b.OpenString(sealed, "a:2"); !errors.Is(err, ErrOpen) {
		t.Fatalf("other aad: err = %v", err)
	}
	if _, err := newBox(t).OpenString(sealed, "a:1"); !errors.Is(err, ErrOpen) {
		t.Fatalf("other key: err = %v", err)
	}
	tampered := bytes.Clone(sealed)
	tampered[len(tampered)-1] ^= 1
	if _, err := b.OpenString(tampered, "a:1"); !errors.Is(err, ErrOpen) {
		t.Fatalf("tampered: err = %v", err)
	}
	for _, bad := range [][]byte{nil, {}, {2, 1, 2, 3}} {
		if _, err := b.Open(bad, nil); !errors.Is(err, ErrOpen) {
			t.Fatalf("Open(%v): err = %v", bad, err)
		}
	}
}

func TestParseKey(t *testing.T) {
	key := make([]byte, KeySize)
	rand.Read(key)
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawURLEncoding} {
		got, err := ParseKey(" " + enc.EncodeToString(key) + "\n")
		if err != nil || !bytes.Equal(got, key) {
			t.Fatalf("ParseKey: %v", err)
		}
	}
	short := base64.StdEncoding.EncodeToString(key[:16])
	if _, err := ParseKey(short); err == nil || strings.Contains(err.Error(), short) {
		t.Fatalf("short key: err = %v", err)
	}
	if _, err := ParseKey("not base64 !!"); err == nil || strings.Contains(err.Error(), "!!") {
		t.Fatalf("bad key: err = %v", err)
	}
	if _, err := New(key[:31]); err == nil {
		t.Fatal("New accepted a 31-byte key")
	}
}
