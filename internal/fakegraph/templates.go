package fakegraph

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// tmpl is a stored template: immutable once stored (updates replace the pointer).
type tmpl struct {
	Template
	waba      string
	comps     []any
	expBody   int
	expHeader int // -1: media header, not counted
}

func (s *Server) newTmpl(waba string, t Template) *tmpl {
	if t.ID == "" {
		t.ID = s.newObjectID()
	}
	t.Status = strings.ToUpper(t.Status)
	if t.Status == "" {
		t.Status = "APPROVED"
	}
	t.Category = strings.ToUpper(t.Category)
	if t.Language == "" {
		t.Language = "en_US"
	}
	nt := &tmpl{Template: t, waba: waba, comps: []any{}}
	if len(t.Components) > 0 {
		b, err := json.Marshal(t.Components)
		if err != nil {
			panic("fakegraph: template components: " + err.Error())
		}
		_ = json.Unmarshal(b, &nt.comps)
	}
	nt.Components = nt.comps
	for _, c := range nt.comps {
		cm, _ := c.(map[string]any)
		typ, _ := cm["type"].(string)
		text, _ := cm["text"].(string)
		switch strings.ToUpper(typ) {
		case "BODY":
			nt.expBody += countPlaceholders(text)
		case "HEADER":
			format, _ := cm["format"].(string)
			if format == "" || strings.EqualFold(format, "TEXT") {
				if nt.expHeader >= 0 {
					nt.expHeader += countPlaceholders(text)
				}
			} else {
				nt.expHeader = -1
			}
		}
	}
	return nt
}

// SetTemplateStatus changes a stored template's status (e.g. PENDING → APPROVED).
func (s *Server) SetTemplateStatus(templateID, status string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.templates[templateID]
	if old == nil {
		return
	}
	t := old.Template
	t.Status = status
	nt := s.newTmpl(old.waba, t)
	s.templates[nt.ID] = nt
	if w := s.wabas[old.waba]; w != nil {
		for i, x := range w.templates {
			if x.ID == nt.ID {
				w.templates[i] = nt
			}
		}
	}
}

var templateStatuses = []string{"APPROVED", "ARCHIVED", "DELETED", "DISABLED", "IN_APPEAL",
	"LIMIT_EXCEEDED", "PAUSED", "PENDING", "PENDING_DELETION", "REJECTED"}

var templateFields = map[string]bool{
	"id": true, "name": true, "status": true, "category": true, "language": true, "components": true,
	"parameter_format": true, "sub_category": true, "previous_category": true, "quality_score": true,
	"rejected_reason": true, "correct_category": true, "library_template_name": true,
	"message_send_ttl_seconds": true, "cta_url_link_tracking_opted_out": true,
}

var defaultTemplateFields = []string{"name", "parameter_format", "components", "language", "status", "category", "id"}

// parseFields reads the fields parameter: requested order, id appended when missing (§2.2: id
// is always returned).
func parseFields(q url.Values, known map[string]bool, defaults []string, nodeType string) ([]string, *gerr) {
	raw := q.Get("fields")
	if raw == "" {
		return defaults, nil
	}
	var out []string
	for f := range strings.SplitSeq(raw, ",") {
		f = strings.TrimSpace(f)
		if i := strings.IndexAny(f, "{.("); i >= 0 {
			f = f[:i]
		}
		if f == "" || slices.Contains(out, f) {
			continue
		}
		if !known[f] {
			return nil, errNonexistingField(f, nodeType)
		}
		out = append(out, f)
	}
	if !slices.Contains(out, "id") {
		out = append(out, "id")
	}
	return out, nil
}

func (t *tmpl) render(b []byte, fields []string) []byte {
	b = append(b, '{')
	first := true
	add := func(k string, v any) {
		if !first {
			b = append(b, ',')
		}
		first = false
		b = appendJSONString(b, k)
		b = append(b, ':')
		vb := marshal(v)
		b = append(b, vb...)
	}
	for _, f := range fields {
		switch f {
		case "id":
			add(f, t.ID)
		case "name":
			add(f, t.Name)
		case "status":
			add(f, t.Status)
		case "category":
			if t.Category != "" {
				add(f, t.Category)
			}
		case "language":
			add(f, t.Language)
		case "components":
			add(f, t.comps)
		case "parameter_format":
			pf := t.ParameterFormat
			if pf == "" {
				pf = "POSITIONAL"
			}
			add(f, pf)
		}
	}
	return append(b, '}')
}

func (s *Server) handleTemplatesList(rc *reqCtx, waba string, _ *tokenState) {
	q := rc.r.URL.Query()
	fields, e := parseFields(q, templateFields, defaultTemplateFields, "WhatsAppBusinessHSM")
	if e != nil {
		s.fail(rc, e)
		return
	}
	statuses, e := enumList(q.Get("status"), "status", templateStatuses)
	if e != nil {
		s.fail(rc, e)
		return
	}
	categories := upperList(q.Get("category"))
	languages := splitList(q.Get("language"))
	name := q.Get("name")

	s.mu.RLock()
	var all []*tmpl
	if w := s.wabas[waba]; w != nil {
		for _, t := range w.templates {
			if name != "" && t.Name != name {
				continue
			}
			if len(statuses) > 0 && !slices.Contains(statuses, t.Status) {
				continue
			}
			if len(categories) > 0 && !slices.Contains(categories, t.Category) {
				continue
			}
			if len(languages) > 0 && !slices.Contains(languages, t.Language) {
				continue
			}
			all = append(all, t)
		}
	}
	s.mu.RUnlock()

	pg, e := s.paginate(rc, q, len(all), "/"+waba+"/message_templates")
	if e != nil {
		s.fail(rc, e)
		return
	}
	b := make([]byte, 0, 512)
	b = append(b, `{"data":[`...)
	for i, t := range all[pg.start:pg.end] {
		if i > 0 {
			b = append(b, ',')
		}
		b = t.render(b, fields)
	}
	b = append(b, ']')
	b = append(b, pg.json...)
	if q.Get("summary") == "total_count" || q.Get("summary") == "true" {
		b = append(b, `,"summary":{"total_count":`...)
		b = strconv.AppendInt(b, int64(len(all)), 10)
		b = append(b, '}')
	}
	b = append(b, '}')
	s.ok(rc, b)
}

func (s *Server) handleTemplateGet(rc *reqCtx, t *tmpl) {
	fields, e := parseFields(rc.r.URL.Query(), templateFields, defaultTemplateFields, "WhatsAppBusinessHSM")
	if e != nil {
		s.fail(rc, e)
		return
	}
	s.ok(rc, t.render(nil, fields))
}

func (s *Server) handleTemplateCreate(rc *reqCtx, waba string) {
	body := params(rc)
	name, _ := str(body, "name")
	if name == "" {
		s.fail(rc, errRequired("name"))
		return
	}
	lang, _ := str(body, "language")
	if lang == "" {
		s.fail(rc, errRequired("language"))
		return
	}
	cat, _ := str(body, "category")
	if cat == "" {
		s.fail(rc, errRequired("category"))
		return
	}
	cat = strings.ToUpper(cat)
	if !slices.Contains([]string{"AUTHENTICATION", "MARKETING", "UTILITY"}, cat) {
		s.fail(rc, errParam(`Param category must be one of {AUTHENTICATION, MARKETING, UTILITY} - got "`+cat+`".`))
		return
	}
	var comps []any
	if raw, ok := body["components"]; ok {
		_ = json.Unmarshal(raw, &comps)
	}
	pf, _ := str(body, "parameter_format")

	s.mu.Lock()
	w := s.wabaLocked(waba)
	for _, t := range w.templates {
		if t.Name == name && t.Language == lang {
			s.mu.Unlock()
			s.fail(rc, &gerr{status: 400, code: 100, subcode: 2388024, typ: "OAuthException",
				msg: "(#100) Invalid parameter", userTitle: "Content in This Language Already Exists",
				userMsg: "There is already " + lang + " content for this template. You can create a new template and try again."})
			return
		}
	}
	nt := s.newTmpl(waba, Template{Name: name, Language: lang, Category: cat, Status: "PENDING",
		Components: comps, ParameterFormat: strings.ToUpper(pf)})
	w.templates = append(w.templates, nt)
	s.templates[nt.ID] = nt
	s.mu.Unlock()
	s.okJSON(rc, struct {
		ID       string `json:"id"`
		Status   string `json:"status"`
		Category string `json:"category"`
	}{nt.ID, nt.Status, nt.Category})
}

func (s *Server) handleTemplateDelete(rc *reqCtx, waba string) {
	q := rc.r.URL.Query()
	name, hsmID := q.Get("name"), q.Get("hsm_id")
	if name == "" {
		s.fail(rc, errRequired("name"))
		return
	}
	s.mu.Lock()
	w := s.wabaLocked(waba)
	kept := w.templates[:0:0]
	removed := 0
	for _, t := range w.templates {
		if t.Name == name && (hsmID == "" || t.ID == hsmID) {
			delete(s.templates, t.ID)
			removed++
			continue
		}
		kept = append(kept, t)
	}
	w.templates = kept
	s.mu.Unlock()
	if removed == 0 {
		s.fail(rc, errInvalidParam("Message template \""+name+"\" not found"))
		return
	}
	s.ok(rc, []byte(`{"success":true}`))
}

// ---- cursor paging shared by list edges ----

type page struct {
	start, end int
	json       []byte // ,"paging":{...} or empty
}

// encodeCursor mimics Graph's cursors: base64 of the row index with each "=" written "ZD"
// ([OAS] example cursors MAZDZD = "0", MjQZD = "24").
func encodeCursor(i int) string {
	return strings.ReplaceAll(base64.StdEncoding.EncodeToString([]byte(strconv.Itoa(i))), "=", "ZD")
}

func decodeCursor(c string) (int, bool) {
	// "Z" never occurs in the base64 of a decimal number, so every "ZD" is padding.
	b, err := base64.StdEncoding.DecodeString(strings.ReplaceAll(c, "ZD", "="))
	if err != nil {
		return 0, false
	}
	n, err := strconv.Atoi(string(b))
	return n, err == nil && n >= 0
}

// paginate applies limit/after/before to total rows and renders the paging object with absolute
// next/previous links that embed the caller's access token, as Graph does (§2.2).
func (s *Server) paginate(rc *reqCtx, q url.Values, total int, edgePath string) (page, *gerr) {
	limit := 25
	if l, err := strconv.Atoi(q.Get("limit")); err == nil && l > 0 {
		limit = l
	}
	start, end := 0, 0
	switch {
	case q.Get("after") != "":
		i, ok := decodeCursor(q.Get("after"))
		if !ok {
			return page{}, errParam("The after parameter is not a valid cursor.")
		}
		start = i + 1
		end = start + limit
	case q.Get("before") != "":
		i, ok := decodeCursor(q.Get("before"))
		if !ok {
			return page{}, errParam("The before parameter is not a valid cursor.")
		}
		end = i
		start = max(end-limit, 0)
	default:
		end = limit
	}
	start = min(start, total)
	end = min(max(end, start), total)
	p := page{start: start, end: end}
	if start == end {
		return p, nil
	}
	var b bytes.Buffer
	b.WriteString(`,"paging":{"cursors":{"before":`)
	b.Write(appendJSONString(nil, encodeCursor(start)))
	b.WriteString(`,"after":`)
	b.Write(appendJSONString(nil, encodeCursor(end-1)))
	b.WriteByte('}')
	if start > 0 {
		b.WriteString(`,"previous":`)
		b.Write(appendJSONString(nil, s.pageLink(rc, q, edgePath, limit, "before", encodeCursor(start))))
	}
	if end < total {
		b.WriteString(`,"next":`)
		b.Write(appendJSONString(nil, s.pageLink(rc, q, edgePath, limit, "after", encodeCursor(end-1))))
	}
	b.WriteByte('}')
	p.json = b.Bytes()
	return p, nil
}

func (s *Server) pageLink(rc *reqCtx, q url.Values, edgePath string, limit int, key, cursor string) string {
	rest := url.Values{}
	for k, v := range q {
		switch k {
		case "access_token", "after", "before", "limit", "pretty":
			continue
		}
		rest[k] = v
	}
	var b strings.Builder
	b.WriteString(s.baseURL(rc))
	b.WriteString("/")
	b.WriteString(s.versionOf(rc))
	b.WriteString(edgePath)
	b.WriteString("?access_token=")
	b.WriteString(url.QueryEscape(rc.token))
	b.WriteString("&pretty=0")
	if enc := rest.Encode(); enc != "" {
		b.WriteString("&")
		b.WriteString(enc)
	}
	b.WriteString("&limit=")
	b.WriteString(strconv.Itoa(limit))
	b.WriteString("&" + key + "=")
	b.WriteString(url.QueryEscape(cursor))
	return b.String()
}

// ---- list parameter helpers ----

func splitList(v string) []string {
	v = strings.Trim(strings.TrimSpace(v), "[]")
	if v == "" {
		return nil
	}
	var out []string
	for p := range strings.SplitSeq(v, ",") {
		p = strings.Trim(strings.TrimSpace(p), `"`)
		if p != "" {
			out = append(out, p)
		}
	}
	return out
}

func upperList(v string) []string {
	l := splitList(v)
	for i := range l {
		l[i] = strings.ToUpper(l[i])
	}
	return l
}

func enumList(v, param string, allowed []string) ([]string, *gerr) {
	l := upperList(v)
	for i, x := range l {
		if !slices.Contains(allowed, x) {
			return nil, errParam("Param " + param + "[" + strconv.Itoa(i) + "] must be one of {" + strings.Join(allowed, ", ") + `} - got "` + x + `".`)
		}
	}
	return l, nil
}
