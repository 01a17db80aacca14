package secretbox

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
)

// newBox returns a box on a random key. (Tests elsewhere take keys from internal/testenv, which
// imports this package: its tests keep their own.)
func newBox(t *testing.T) *Box {
	t.Helper()
	b, err := New(randKey())
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
	key := randKey()
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

// randKey returns a random key.
func randKey() []byte {
	k := make([]byte, KeySize)
	rand.Read(k)
	return k
}

// sealV1 seals as builds before key lists did: version byte 1, nonce, ciphertext (no key id).
func sealV1(t *testing.T, key []byte, plaintext, aad string) []byte {
	t.Helper()
	block, err := aes.NewCipher(key)
	if err != nil {
		t.Fatal(err)
	}
	aead, err := cipher.NewGCMWithRandomNonce(block)
	if err != nil {
		t.Fatal(err)
	}
	return aead.Seal([]byte{1}, nil, []byte(plaintext), []byte(aad))
}

// TestKeyring: the first key seals, every listed key opens; the version byte and key id name the
// sealing key; a key not in the list opens nothing.
func TestKeyring(t *testing.T) {
	a, b, c := randKey(), randKey(), randKey()
	boxA, _ := New(a)
	boxBA, err := NewKeyring(b, a)
	if err != nil {
		t.Fatal(err)
	}
	boxB, _ := New(b)
	boxC, _ := New(c)

	underA := boxA.SealString("tok", "t.c:1")
	underB := boxBA.SealString("tok", "t.c:1")
	if underA[0] != 2 || underB[0] != 2 {
		t.Fatalf("version bytes %d %d, want 2", underA[0], underB[0])
	}
	if !bytes.Equal(underA[:HeaderSize], boxA.Header()) || !bytes.Equal(underB[:HeaderSize], boxB.Header()) || !bytes.Equal(boxBA.Header(), boxB.Header()) {
		t.Fatal("header does not name the sealing (first) key")
	}
	if !boxBA.IsCurrent(underB) || boxBA.IsCurrent(underA) || !boxA.IsCurrent(underA) {
		t.Fatal("IsCurrent")
	}
	for name, tc := range map[string]struct {
		box    *Box
		sealed []byte
		ok     bool
	}{
		"[B,A] opens A's": {boxBA, underA, true}, "[B,A] opens B's": {boxBA, underB, true},
		"[B] opens B's": {boxB, underB, true}, "[B] refuses A's": {boxB, underA, false},
		"[A] refuses B's": {boxA, underB, false}, "[C] refuses both": {boxC, underA, false},
	} {
		got, err := tc.box.OpenString(tc.sealed, "t.c:1")
		if tc.ok && (err != nil || got != "tok") {
			t.Errorf("%s: %q %v", name, got, err)
		}
		if !tc.ok && !errors.Is(err, ErrOpen) {
			t.Errorf("%s: err = %v, want ErrOpen", name, err)
		}
	}
	// the header is authenticated: another key id (even one in the list) does not open it
	forged := bytes.Clone(underB)
	copy(forged[1:HeaderSize], boxA.Header()[1:])
	if _, err := boxBA.Open(forged, []byte("t.c:1")); !errors.Is(err, ErrOpen) {
		t.Fatalf("forged key id: %v", err)
	}
	if ids := boxBA.KeyIDs(); len(ids) != 2 || ids[0] != boxB.KeyIDs()[0] || ids[1] != boxA.KeyIDs()[0] || len(ids[0]) != 2*keyIDSize {
		t.Fatalf("KeyIDs = %v", ids)
	}
	if _, err := NewKeyring(); err == nil {
		t.Fatal("empty keyring accepted")
	}
	if _, err := NewKeyring(a, b, a); err == nil || !strings.Contains(err.Error(), "keys 1 and 3") {
		t.Fatalf("duplicate key: %v", err)
	}
}

// TestOpenFormat1: values sealed by builds before key lists (version byte 1, no key id) open
// with whichever listed key sealed them, and only with the right aad.
func TestOpenFormat1(t *testing.T) {
	a, b := randKey(), randKey()
	old := sealV1(t, a, "EAAG-old", "channels.upstream_token:7")
	for _, keys := range [][][]byte{{a}, {b, a}, {a, b}} {
		box, _ := NewKeyring(keys...)
		got, err := box.OpenString(old, "channels.upstream_token:7")
		if err != nil || got != "EAAG-old" {
			t.Fatalf("open v1 with %d keys: %q %v", len(keys), got, err)
		}
		if box.IsCurrent(old) {
			t.Fatal("a v1 value is never current")
		}
		if _, err := box.OpenString(old, "channels.upstream_token:8"); !errors.Is(err, ErrOpen) {
			t.Fatalf("v1 with other aad: %v", err)
		}
	}
	boxB, _ := New(b)
	if _, err := boxB.OpenString(old, "channels.upstream_token:7"); !errors.Is(err, ErrOpen) {
		t.Fatalf("v1 with a key not in the list: %v", err)
	}
}

func TestParseKeys(t *testing.T) {
	a, b := randKey(), randKey()
	sa, sb := base64.StdEncoding.EncodeToString(a), base64.RawURLEncoding.EncodeToString(b)
	for _, in := range []string{sa + "," + sb, sa + " " + sb, " " + sa + ",\n\t" + sb + ", ", sa + "  ,  " + sb} {
		keys, err := ParseKeys(in)
		if err != nil || len(keys) != 2 || !bytes.Equal(keys[0], a) || !bytes.Equal(keys[1], b) {
			t.Fatalf("ParseKeys(%q): %d keys, %v", in, len(keys), err)
		}
	}
	for _, in := range []string{"", " , ", sa + ",c2hvcnQ=", sa + ",zz!!" + sb} {
		_, err := ParseKeys(in)
		if err == nil {
			t.Fatalf("ParseKeys(%q) accepted", in)
		}
		if strings.Contains(err.Error(), sa) || strings.Contains(err.Error(), sb) || strings.Contains(err.Error(), "c2hvcnQ") {
			t.Fatalf("error reveals a key: %v", err)
		}
	}
	if _, err := ParseKeys(sa + ",c2hvcnQ="); err == nil || !strings.Contains(err.Error(), "key 2 of 2") {
		t.Fatalf("error does not name the position: %v", err)
	}
}
