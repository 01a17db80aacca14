package caddymodule

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
)

// Switch is an on/off option written as a boolean, or as a placeholder ({env.NAME}) resolved
// at provision time to one: an empty value is off, anything else must parse as a boolean
// (strconv.ParseBool). A placeholder, unlike a {$NAME} Caddyfile substitution, cannot add
// other configuration. In JSON it is true, false or the placeholder string.
type Switch string

// UnmarshalJSON accepts a boolean or a string.
func (s *Switch) UnmarshalJSON(b []byte) error {
	var v bool
	if json.Unmarshal(b, &v) == nil {
		*s = Switch(strconv.FormatBool(v))
		return nil
	}
	var str string
	if err := json.Unmarshal(b, &str); err != nil {
		return errors.New("expected true, false or a placeholder string")
	}
	*s = Switch(str)
	return s.check()
}

// MarshalJSON writes a literal as a boolean, a placeholder as a string.
func (s Switch) MarshalJSON() ([]byte, error) {
	if v, err := strconv.ParseBool(string(s)); err == nil {
		return json.Marshal(v)
	}
	return json.Marshal(string(s))
}

// check refuses a literal that is not a boolean (placeholders are checked when resolved).
func (s Switch) check() error {
	if s == "" || strings.Contains(string(s), "{") {
		return nil
	}
	if _, err := strconv.ParseBool(string(s)); err != nil {
		return fmt.Errorf("expected true, false or an {env.NAME} placeholder, got %q", string(s))
	}
	return nil
}

// resolve returns the switch's value, its placeholders replaced. Errors name the option.
func (s Switch) resolve(repl *caddy.Replacer, name string) (bool, error) {
	v, err := resolveSecret(repl, name, string(s), false)
	if err != nil || v == "" {
		return false, err
	}
	on, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("%s: expected true or false%s", name, envHint(string(s)))
	}
	return on, nil
}

// envHint names the environment variable of a value that is exactly one {env.NAME}
// placeholder, for error messages: " (from WABARELAY_X)"; empty otherwise.
func envHint(raw string) string {
	if name := envName(raw); name != "" {
		return " (from " + name + ")"
	}
	return ""
}

// envName returns NAME when raw is exactly the placeholder {env.NAME}.
func envName(raw string) string {
	raw = strings.TrimSpace(raw)
	if strings.HasPrefix(raw, "{env.") && strings.HasSuffix(raw, "}") && strings.Count(raw, "{") == 1 {
		return raw[len("{env.") : len(raw)-1]
	}
	return ""
}
