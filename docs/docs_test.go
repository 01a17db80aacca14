package docs_test

import (
	"bytes"
	"testing"

	"github.com/wabarelay/wabarelay/docs"
	"github.com/wabarelay/wabarelay/internal/openapitest"
)

func TestOpenAPIEmbedded(t *testing.T) {
	if !bytes.HasPrefix(docs.OpenAPI, []byte("openapi: 3.1.0\n")) {
		t.Fatalf("docs.OpenAPI does not start with \"openapi: 3.1.0\": %.40q", docs.OpenAPI)
	}
}

// TestOpenAPIValid parses and validates the document, its examples included.
func TestOpenAPIValid(t *testing.T) {
	openapitest.Load(t)
}
