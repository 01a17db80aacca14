package graph

import (
	"context"
	"strings"
	"testing"

	"github.com/wabarelay/wabarelay/internal/fakegraph"
)

// TestGetNumberHealth: the read asks for the health fields and returns the upstream's strings;
// the messaging limit falls back to messaging_limit_tier; a dead token is an *Error with code
// 190 that names no secret.
func TestGetNumberHealth(t *testing.T) {
	fx := setup(t)
	ctx := context.Background()
	h, err := fx.c.GetNumberHealth(ctx, theToken, pnid)
	if err != nil {
		t.Fatal(err)
	}
	if h != (NumberHealth{QualityRating: "GREEN", MessagingLimit: "TIER_2K", Throughput: "STANDARD", NameStatus: "APPROVED"}) {
		t.Fatalf("health %+v", h)
	}
	reqs := fx.g.RequestsTo("GET", "/"+pnid)
	if len(reqs) != 1 || !strings.Contains(reqs[0].RawQuery, "fields=quality_rating%2Cname_status%2Cthroughput%2Cwhatsapp_business_manager_messaging_limit%2Cmessaging_limit_tier") {
		t.Fatalf("requests %+v", reqs)
	}
	fx.g.SetNumberHealth(pnid, fakegraph.NumberHealth{QualityRating: "SOMETHING_NEW", NoManagerLimit: true, MessagingLimitTier: "TIER_1K", Throughput: "HIGH"})
	if h, err = fx.c.GetNumberHealth(ctx, theToken, pnid); err != nil || h != (NumberHealth{QualityRating: "SOMETHING_NEW", MessagingLimit: "TIER_1K", Throughput: "HIGH", NameStatus: "APPROVED"}) {
		t.Fatalf("health %+v %v", h, err)
	}
	if n := fx.g.HealthReads(pnid); n != 2 {
		t.Fatalf("fake counted %d health reads", n)
	}
	fx.g.RevokeToken(theToken)
	_, err = fx.c.GetNumberHealth(ctx, theToken, pnid)
	if ge := asError(t, err); ge.Code != 190 {
		t.Fatalf("dead token: %v", err)
	}
	if _, err := fx.c.GetNumberHealth(ctx, "", pnid); err == nil {
		t.Fatal("empty token accepted")
	}
}
