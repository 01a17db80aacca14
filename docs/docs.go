// Package docs holds wabarelay's hand-written API description.
//
// OpenAPI is docs/openapi.yaml, the OpenAPI 3.1 document of the management API. Tests check
// the server against it with internal/openapitest; it can also be served or published as is.
package docs

import _ "embed"

// OpenAPI is the OpenAPI 3.1.0 document (YAML) of the management API served under {base_url}:
// its operations, schemas, status codes and error messages.
//
//go:embed openapi.yaml
var OpenAPI []byte
