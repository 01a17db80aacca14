package managementapi

import (
	"net/http"

	"github.com/wabarelay/wabarelay/store"
)

// Principal is the caller of an operation. It is one of two kinds.
//
// An API key's principal, Principal{Key: k, Origin: o}, is the caller of the management API and
// the dashboard's signed-in user. Key is the API key it acts as, whose org scopes every
// operation; Origin is the origin (scheme and host, httpx.Origin) its request addressed, the
// prefix of connect links when Options.ConnectBase is empty. The key must be the current
// record of a valid key: one that exists, is not revoked and is not past its expiry
// (store.Store.AuthenticateAPIKey and store.Store.ActiveAPIKey check exactly that); operations
// do not check it again.
//
// The operator's principal, Operator(), is the CLI's: whoever holds the database's
// credentials. It belongs to no org, so it makes the operator's operations only (see the
// Service), which name their org or record themselves.
type Principal struct {
	Key    store.APIKey
	Origin string

	operator bool
}

// Operator returns the operator's principal.
func Operator() Principal { return Principal{operator: true} }

// IsOperator reports whether p is the operator's principal.
func (p Principal) IsOperator() bool { return p.operator }

// errOperatorOnly refuses an operator's operation to an API key. No route of the API leads to
// one; the check keeps a caller of the Service from crossing orgs with a key.
var errOperatorOnly = &Error{http.StatusForbidden, "Only the operator may do this"}
