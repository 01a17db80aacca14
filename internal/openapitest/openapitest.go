// Package openapitest checks real HTTP exchanges with the management API against its OpenAPI
// document (docs/openapi.yaml), so that handler tests double as contract tests.
//
// Typical use in a handler test:
//
//	var spec = openapitest.Load(t) // once per test (or per package, with a testing.TB at hand)
//
//	body := []byte(`{"name":"Support line"}`)
//	req := httptest.NewRequest(http.MethodPost, "/channels", bytes.NewReader(body))
//	req.Header.Set("Content-Type", "application/json")
//	req.Header.Set("x-api-key", key)
//	rec := httptest.NewRecorder()
//	handler.ServeHTTP(rec, req)
//	spec.Check(t, req, body, rec.Code, rec.Header(), rec.Body.Bytes())
//
// The request path must be relative to {base_url} (as the handler sees it after Caddy's
// handle_path strips the prefix). The request body is passed separately because the handler has
// consumed req.Body by then.
package openapitest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/wabarelay/wabarelay/docs"
)

// Validator checks exchanges against the OpenAPI document. It is safe for concurrent use.
type Validator struct {
	doc    *openapi3.T
	router routers.Router
}

// formatOptions are the string formats the document uses that kin-openapi does not check by
// default ("date-time" it checks itself). They apply to this document only, not globally.
var formatOptions = []openapi3.SchemaValidationOption{
	openapi3.WithStringFormatValidator("uuid",
		openapi3.NewRegexpFormatValidator(openapi3.FormatOfStringForUUIDOfRFC9562)),
	openapi3.WithStringFormatValidator("uri", openapi3.NewCallbackValidator(func(s string) error {
		u, err := url.Parse(s)
		if err != nil {
			return err
		}
		if !u.IsAbs() || u.Host == "" {
			return fmt.Errorf("%q is not an absolute URI with a host", s)
		}
		return nil
	})),
}

// loaded is what Load built: the document is parsed and validated once per test binary (about
// 0.3 s under -race), and its Validator, safe for concurrent use, is shared.
var loaded struct {
	once sync.Once
	v    *Validator
	err  error
}

// Load parses docs.OpenAPI, validates it (examples included) and builds a router that matches
// operations by method and path only (the document's {base_url} server is ignored); the first
// call does, later calls return the same Validator. Any problem is fatal (to every caller).
func Load(t testing.TB) *Validator {
	t.Helper()
	loaded.once.Do(func() { loaded.v, loaded.err = load() })
	if loaded.err != nil {
		t.Fatalf("openapitest: %v", loaded.err)
	}
	return loaded.v
}

func load() (*Validator, error) {
	ctx := context.Background()
	loader := openapi3.NewLoader()
	loader.IsExternalRefsAllowed = false
	loader.Context = ctx
	doc, err := loader.LoadFromData(docs.OpenAPI)
	if err != nil {
		return nil, fmt.Errorf("load docs/openapi.yaml: %w", err)
	}
	if !doc.IsOpenAPI31OrLater() {
		return nil, fmt.Errorf("docs/openapi.yaml is OpenAPI %s, want 3.1", doc.OpenAPI)
	}
	if err := doc.Validate(ctx, openapi3.EnableExamplesValidation()); err != nil {
		return nil, fmt.Errorf("docs/openapi.yaml is not valid: %w", err)
	}
	// Paths given to Check are relative to {base_url}: with no servers, the router matches
	// the path alone, whatever the host and prefix.
	doc.Servers = nil
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		return nil, fmt.Errorf("build router: %w", err)
	}
	return &Validator{doc: doc, router: router}, nil
}

// Doc returns the parsed document (do not modify it).
func (v *Validator) Doc() *openapi3.T { return v.doc }

// Operations returns "METHOD /path/{param}" for every operation of the document, sorted.
func (v *Validator) Operations() []string {
	var out []string
	for path, item := range v.doc.Paths.Map() {
		for method := range item.Operations() {
			out = append(out, strings.ToUpper(method)+" "+path)
		}
	}
	sort.Strings(out)
	return out
}

func (v *Validator) options() *openapi3filter.Options {
	opts := &openapi3filter.Options{
		// API keys are tested separately: accept any (or no) credential here.
		AuthenticationFunc:      openapi3filter.NoopAuthenticationFunc,
		IncludeResponseStatus:   true,
		MultiError:              true,
		SkipSettingDefaults:     true,
		SchemaValidationOptions: slices.Clone(formatOptions),
	}
	// Name the offending field and the reason, without dumping the whole schema and value
	// (Check prints the body).
	opts.WithCustomSchemaErrorFunc(func(err *openapi3.SchemaError) string {
		return fmt.Sprintf("at %q: %s", "/"+strings.Join(err.JSONPointer(), "/"), err.Reason)
	})
	return opts
}

// Check validates one real exchange against the document and reports every mismatch with
// t.Errorf (it never stops the test):
//
//   - The request (method, path relative to {base_url}, query, headers, reqBody) must match an
//     operation, else "no route in the spec for METHOD PATH". Exception: an answer the server
//     gives to paths or methods outside the document — 404 `Not found` for an unknown path,
//     405 `Method not allowed` for an unsupported method, or 401/429 (authentication and rate
//     limiting run before routing) — is checked against the shared response of that status.
//   - The status must be documented for the operation, else "status N not documented for this
//     operation".
//   - Headers and body of the response must match the documented response (schema, required
//     headers, Content-Type; an empty body where none is documented).
//   - A request the document considers invalid (body schema, parameters, Content-Type) must not
//     be answered with a 2xx. Invalid requests answered with an error are expected (that is how
//     handler tests exercise 400/413/415/422) and only their response is checked.
//
// Authentication is not checked (any x-api-key, or none, is accepted).
func (v *Validator) Check(t testing.TB, req *http.Request, reqBody []byte, status int, respHeader http.Header, respBody []byte) {
	t.Helper()
	ctx := context.Background()
	r := req.Clone(ctx)
	setBody(r, reqBody)
	if respHeader == nil {
		respHeader = http.Header{}
	}
	label := req.Method + " " + req.URL.RequestURI()

	route, pathParams, err := v.router.FindRoute(r)
	if err != nil {
		v.checkUnrouted(t, r, err, label, status, respHeader, respBody)
		return
	}
	op := route.Method + " " + route.Path
	opts := v.options()
	reqInput := &openapi3filter.RequestValidationInput{
		Request:    r,
		PathParams: pathParams,
		Route:      route,
		Options:    opts,
	}
	reqErr := openapi3filter.ValidateRequest(ctx, reqInput)
	if reqErr != nil && status >= 200 && status < 300 {
		t.Errorf("openapitest: %s (operation %s): server answered %d to a request the document says is invalid:\n%v",
			label, op, status, reqErr)
	}

	responseRef := route.Operation.Responses.Status(status)
	if responseRef == nil {
		t.Errorf("openapitest: %s: status %d not documented for this operation (%s documents %s); body: %s",
			label, status, op, documentedStatuses(route.Operation), truncate(respBody))
		return
	}
	v.checkResponse(t, label, op, reqInput, responseRef, status, respHeader, respBody)
}

// checkResponse validates the response of an exchange whose request resolved to
// reqInput.Route, whose operation documents status with responseRef.
func (v *Validator) checkResponse(t testing.TB, label, op string, reqInput *openapi3filter.RequestValidationInput,
	responseRef *openapi3.ResponseRef, status int, respHeader http.Header, respBody []byte,
) {
	t.Helper()
	if responseRef.Value != nil && len(responseRef.Value.Content) == 0 && len(respBody) != 0 {
		t.Errorf("openapitest: %s (operation %s): status %d must have an empty body, got: %s",
			label, op, status, truncate(respBody))
	}
	respInput := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: reqInput,
		Status:                 status,
		Header:                 respHeader,
		Body:                   io.NopCloser(bytes.NewReader(respBody)),
		Options:                reqInput.Options,
	}
	if err := openapi3filter.ValidateResponse(context.Background(), respInput); err != nil {
		t.Errorf("openapitest: %s (operation %s): response %d does not match the document:\n%v\nbody: %s",
			label, op, status, err, truncate(respBody))
	}
}

// unroutedResponses are the shared responses (components/responses) the server may give to a
// request that matches no operation, by status and by router error.
var unroutedResponses = []struct {
	status   int
	routeErr error // nil: any
	name     string
}{
	{http.StatusNotFound, routers.ErrPathNotFound, "NotFound"},
	{http.StatusMethodNotAllowed, routers.ErrMethodNotAllowed, "MethodNotAllowed"},
	{http.StatusUnauthorized, nil, "Unauthorized"},
	{http.StatusTooManyRequests, nil, "TooManyRequests"},
}

func (v *Validator) checkUnrouted(t testing.TB, r *http.Request, routeErr error, label string, status int, respHeader http.Header, respBody []byte) {
	t.Helper()
	for _, u := range unroutedResponses {
		if u.status != status || (u.routeErr != nil && !errors.Is(routeErr, u.routeErr)) {
			continue
		}
		responseRef := v.doc.Components.Responses[u.name]
		if responseRef == nil {
			t.Errorf("openapitest: the document lacks components/responses/%s", u.name)
			return
		}
		// A stand-in operation documenting only this response.
		route := &routers.Route{
			Spec:     v.doc,
			Path:     r.URL.Path,
			PathItem: &openapi3.PathItem{},
			Method:   r.Method,
			Operation: &openapi3.Operation{
				Responses: openapi3.NewResponses(openapi3.WithStatus(status, responseRef)),
			},
		}
		reqInput := &openapi3filter.RequestValidationInput{Request: r, Route: route, Options: v.options()}
		v.checkResponse(t, label, "none: components/responses/"+u.name, reqInput, responseRef, status, respHeader, respBody)
		return
	}
	t.Errorf("openapitest: no route in the spec for %s %s (%v); server answered %d: %s",
		r.Method, r.URL.Path, routeErr, status, truncate(respBody))
}

func setBody(r *http.Request, body []byte) {
	if len(body) == 0 {
		r.Body, r.GetBody, r.ContentLength = http.NoBody, nil, 0
		return
	}
	r.ContentLength = int64(len(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	r.Body, _ = r.GetBody()
}

func documentedStatuses(op *openapi3.Operation) string {
	var codes []string
	for code := range op.Responses.Map() {
		codes = append(codes, code)
	}
	sort.Strings(codes)
	return strings.Join(codes, ", ")
}

func truncate(b []byte) string {
	const max = 500
	if len(b) == 0 {
		return "(empty)"
	}
	if len(b) > max {
		return strconv.Quote(string(b[:max])) + "…"
	}
	return strconv.Quote(string(b))
}
