// Package secretbox encrypts short secrets at rest (upstream access tokens, webhook signing
// secrets, channel tokens) with AES-256-GCM.
//
// A sealed value is: version byte (1) || 12-byte random nonce || ciphertext+tag. The caller passes
// additional authenticated data naming where the value lives (for example "channels.upstream_token:"
// + row id), so a ciphertext copied to another row or column fails to open.
package secretbox

import (
	"crypto/aes"
	"crypto/cipher"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
)

// KeySize is the length in bytes of an encryption key.
const KeySize = 32

const version1 = 1

// ErrOpen is returned when a sealed value cannot be decrypted: wrong key, tampered data, or data
// sealed for another place.
var ErrOpen = errors.New("secretbox: message authentication failed")

// Box seals and opens values under one key. It is safe for concurrent use.
type Box struct {
	aead cipher.AEAD
}

// New returns a Box for a 32-byte key.
func New(key []byte) (*Box, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("secretbox: key must be %d bytes, got %d", KeySize, len(key))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("secretbox: %w", err)
	}
	aead, err := cipher.NewGCMWithRandomNonce(block)
	if err != nil {
		return nil, fmt.Errorf("secretbox: %w", err)
	}
	return &Box{aead: aead}, nil
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

// Seal encrypts plaintext bound to aad.
func (b *Box) Seal(plaintext, aad []byte) []byte {
	out := make([]byte, 1, 1+b.aead.NonceSize()+len(plaintext)+b.aead.Overhead())
	out[0] = version1
	return b.aead.Seal(out, nil, plaintext, aad)
}

// Open decrypts a value produced by Seal with the same aad.
func (b *Box) Open(sealed, aad []byte) ([]byte, error) {
	if len(sealed) < 1 || sealed[0] != version1 {
		return nil, ErrOpen
	}
	pt, err := b.aead.Open(nil, nil, sealed[1:], aad)
	if err != nil {
		return nil, ErrOpen
	}
	return pt, nil
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
