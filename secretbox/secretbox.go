// Package secretbox encrypts short secrets at rest (upstream access tokens, webhook signing
// secrets, channel tokens) with AES-256-GCM, under a list of keys so the key can be rotated.
//
// A Box holds one or more keys: the first (the primary) seals, every one opens. A sealed value
// is: version byte (2) || 4-byte key id || 12-byte random nonce || ciphertext+tag, the first five
// bytes (Header) naming the key that sealed it and authenticated with the data. Values sealed by
// earlier builds — version byte (1) || nonce || ciphertext+tag, with no key id — still open with
// whichever listed key opens them. The caller passes additional authenticated data naming where
// the value lives (for example "channels.upstream_token:" + row id), so a ciphertext copied to
// another row or column fails to open.
package secretbox

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"unicode"
)

// KeySize is the length in bytes of an encryption key.
const KeySize = 32

// Format versions: the first byte of a sealed value.
const (
	version1 = 1 // version1 || nonce || ciphertext+tag (one key, no key id)
	version2 = 2 // version2 || key id || nonce || ciphertext+tag
)

// keyIDSize is the length of the key id in a version 2 value.
const keyIDSize = 4

// HeaderSize is the length of Header: the version byte and the key id.
const HeaderSize = 1 + keyIDSize

// ErrOpen is returned when a sealed value cannot be decrypted: wrong key, tampered data, or data
// sealed for another place.
var ErrOpen = errors.New("secretbox: message authentication failed")

// Box seals and opens values under a list of keys. It is safe for concurrent use.
type Box struct {
	keys []boxKey // keys[0] seals
}

type boxKey struct {
	id   [keyIDSize]byte
	aead cipher.AEAD
}

// New returns a Box for one 32-byte key.
func New(key []byte) (*Box, error) {
	return NewKeyring(key)
}

// NewKeyring returns a Box for a list of 32-byte keys: the first seals, every one opens. The
// list may not be empty or name one key twice. Errors never contain a key.
func NewKeyring(keys ...[]byte) (*Box, error) {
	if len(keys) == 0 {
		return nil, errors.New("secretbox: no key")
	}
	b := &Box{}
	for i, key := range keys {
		if len(key) != KeySize {
			return nil, fmt.Errorf("secretbox: key %d: must be %d bytes, got %d", i+1, KeySize, len(key))
		}
		for j, other := range keys[:i] {
			if bytes.Equal(key, other) {
				return nil, fmt.Errorf("secretbox: keys %d and %d are the same key", j+1, i+1)
			}
		}
		block, err := aes.NewCipher(key)
		if err != nil {
			return nil, fmt.Errorf("secretbox: %w", err)
		}
		aead, err := cipher.NewGCMWithRandomNonce(block)
		if err != nil {
			return nil, fmt.Errorf("secretbox: %w", err)
		}
		b.keys = append(b.keys, boxKey{id: keyID(key), aead: aead})
	}
	return b, nil
}

// keyID names a key in sealed values and logs: the first bytes of a domain-separated SHA-256
// of the key. It reveals nothing usable about a 256-bit random key.
func keyID(key []byte) [keyIDSize]byte {
	h := sha256.New()
	h.Write([]byte("wabarelay secretbox key id\x00"))
	h.Write(key)
	var id [keyIDSize]byte
	copy(id[:], h.Sum(nil))
	return id
}

// KeyIDs returns the hex ids of the box's keys, the primary first (for logs and operator
// output: an id is not secret).
func (b *Box) KeyIDs() []string {
	ids := make([]string, len(b.keys))
	for i, k := range b.keys {
		ids[i] = hex.EncodeToString(k.id[:])
	}
	return ids
}

// Header returns the first HeaderSize bytes of every value Seal produces now: the format
// version and the primary key's id. A stored value that does not start with it was sealed
// under another key or in the old format (see IsCurrent).
func (b *Box) Header() []byte {
	h := make([]byte, HeaderSize)
	h[0] = version2
	copy(h[1:], b.keys[0].id[:])
	return h
}

// IsCurrent reports whether sealed was sealed under the primary key in the current format, so
// that re-encrypting it would change nothing. It does not authenticate the value.
func (b *Box) IsCurrent(sealed []byte) bool {
	return bytes.HasPrefix(sealed, b.Header())
}

// ParseKey decodes a key given as standard or URL-safe base64 (padded or not) of 32 bytes. The
// error never contains the key.
func ParseKey(s string) ([]byte, error) {
	s = strings.TrimSpace(s)
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if b, err := enc.DecodeString(s); err == nil {
			if len(b) != KeySize {
				return nil, fmt.Errorf("encryption key must decode to %d bytes, got %d", KeySize, len(b))
			}
			return b, nil
		}
	}
	return nil, errors.New("encryption key is not valid base64")
}

// ParseKeys decodes a list of keys separated by commas and/or whitespace (neither occurs in
// base64), each as ParseKey takes it; the first is the one that seals. An empty list is an
// error. Errors name the key by position, never by value.
func ParseKeys(s string) ([][]byte, error) {
	fields := strings.FieldsFunc(s, func(r rune) bool { return r == ',' || unicode.IsSpace(r) })
	if len(fields) == 0 {
		return nil, errors.New("no encryption key given")
	}
	keys := make([][]byte, len(fields))
	for i, f := range fields {
		k, err := ParseKey(f)
		if err != nil {
			if len(fields) == 1 {
				return nil, err
			}
			return nil, fmt.Errorf("key %d of %d: %w", i+1, len(fields), err)
		}
		keys[i] = k
	}
	return keys, nil
}

// Seal encrypts plaintext bound to aad under the primary key.
func (b *Box) Seal(plaintext, aad []byte) []byte {
	k := b.keys[0]
	out := make([]byte, HeaderSize, HeaderSize+k.aead.NonceSize()+len(plaintext)+k.aead.Overhead())
	out[0] = version2
	copy(out[1:], k.id[:])
	return k.aead.Seal(out, nil, plaintext, headerAAD(out[:HeaderSize], aad))
}

// headerAAD is the data authenticated with a version 2 value: its header, then the caller's aad.
func headerAAD(header, aad []byte) []byte {
	return append(append(make([]byte, 0, len(header)+len(aad)), header...), aad...)
}

// Open decrypts a value produced by Seal (of this build, under any of the box's keys, or of an
// earlier build in format 1) with the same aad.
func (b *Box) Open(sealed, aad []byte) ([]byte, error) {
	if len(sealed) < 1 {
		return nil, ErrOpen
	}
	switch sealed[0] {
	case version1:
		for _, k := range b.keys {
			if pt, err := k.aead.Open(nil, nil, sealed[1:], aad); err == nil {
				return pt, nil
			}
		}
	case version2:
		if len(sealed) < HeaderSize {
			return nil, ErrOpen
		}
		full := headerAAD(sealed[:HeaderSize], aad)
		for _, k := range b.keys {
			if !bytes.Equal(k.id[:], sealed[1:HeaderSize]) {
				continue
			}
			if pt, err := k.aead.Open(nil, nil, sealed[HeaderSize:], full); err == nil {
				return pt, nil
			}
		}
	}
	return nil, ErrOpen
}

// SealString is Seal for strings.
func (b *Box) SealString(plaintext, aad string) []byte {
	return b.Seal([]byte(plaintext), []byte(aad))
}

// OpenString is Open for strings.
func (b *Box) OpenString(sealed []byte, aad string) (string, error) {
	pt, err := b.Open(sealed, []byte(aad))
	return string(pt), err
}
