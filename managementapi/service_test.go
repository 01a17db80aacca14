package managementapi_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/internal/testenv"
	"github.com/wabarelay/wabarelay/managementapi"
	"github.com/wabarelay/wabarelay/store"
)

// TestReconnectRule: the reconnect rule the Service answers by and the dashboard offers its
// button by (ChannelOverview.Reconnectable) is the one store.ReopenLink applies in its update:
// in every state of a channel they agree, and a refusal is the one the store's error maps to.
func TestReconnectRule(t *testing.T) {
	f := testenv.NewStore(t)
	ctx := context.Background()
	org := f.Org(t)
	key, _ := f.APIKey(t, org.ID)
	svc := managementapi.NewService(managementapi.Options{Store: f.Store, ConnectBase: connectBase})
	p := managementapi.Principal{Key: key}
	for _, tc := range []struct {
		name      string
		connected bool
		set       string // the state, an UPDATE's SET clause
	}{
		{"pending, link open", false, ""},
		{"pending, link expired", false, `token_expires_at = now() - interval '1 minute'`},
		{"pending, no link", false, `token_expires_at = NULL`},
		{"active", true, ""},
		{"active, token dead", true, `upstream_disconnected_at = now()`},
		{"active, token dead, link open", true, `upstream_disconnected_at = now(), token_expires_at = now() + interval '1 hour'`},
		{"inactive by the upstream", true, `status = 'inactive', inactive_reason = 'upstream'`},
		{"inactive by the operator", true, `status = 'inactive', inactive_reason = 'operator'`},
		{"inactive by the operator, token dead", true, `status = 'inactive', inactive_reason = 'operator', upstream_disconnected_at = now()`},
		{"inactive by the operator, never connected", false, `status = 'inactive', inactive_reason = 'operator', token_expires_at = NULL`},
	} {
		// twins in the state: the store reopens one, the Service the other
		var ids [2]uuid.UUID
		for i := range ids {
			opts := testenv.ChannelOpts{Name: tc.name}
			if tc.connected {
				opts.Connection = f.Connection()
			}
			ids[i] = f.Channel(t, org.ID, &opts).ID
			if tc.set != "" {
				f.Exec(t, `UPDATE channels SET `+tc.set+` WHERE id = $1`, ids[i])
			}
		}
		overviews, err := svc.ChannelOverviews(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		var offered, found bool
		for _, o := range overviews {
			if o.ID == ids[0] {
				offered, found = o.Reconnectable, true
			}
		}
		if !found {
			t.Fatalf("%s: not in the overviews", tc.name)
		}
		_, storeErr := f.Store.ReopenLink(ctx, &org.ID, ids[0], time.Hour, false)
		_, svcErr := svc.ReconnectChannel(ctx, p, ids[1].String())
		if offered != (storeErr == nil) || (svcErr == nil) != (storeErr == nil) {
			t.Errorf("%s: overview offers %v, store: %v, Service: %v", tc.name, offered, storeErr, svcErr)
			continue
		}
		if storeErr == nil {
			continue
		}
		want := managementapi.MsgNotReconnectable
		if errors.Is(storeErr, store.ErrOperatorDeactivated) {
			want = managementapi.MsgOperatorDeactivated
		} else if !errors.Is(storeErr, store.ErrNotReconnectable) {
			t.Fatalf("%s: store: %v", tc.name, storeErr)
		}
		if e, ok := errors.AsType[*managementapi.Error](svcErr); !ok || e.Status != http.StatusConflict || e.Message != want {
			t.Errorf("%s: Service refused with %v, want 409 %q", tc.name, svcErr, want)
		}
	}
}

// TestOperatorOperations: the operator's operations cross orgs and caps and answer with the
// record's org; their errors are the store's; an API key's principal is refused them.
func TestOperatorOperations(t *testing.T) {
	f := testenv.NewStore(t)
	ctx := context.Background()
	svc := managementapi.NewService(managementapi.Options{Store: f.Store, MaxAPIKeysPerOrg: 1})
	op := managementapi.Operator()
	if !op.IsOperator() {
		t.Fatal("Operator() is not the operator")
	}

	o, err := svc.CreateOrg(ctx, op, "Acme")
	if err != nil || o.Name != "Acme" || o.ID == uuid.Nil {
		t.Fatalf("CreateOrg: %+v %v", o, err)
	}
	// at the org's cap of one live key, the operator still creates one
	first, _ := f.APIKey(t, o.ID)
	k, err := svc.CreateOrgAPIKey(ctx, op, o.ID, "ci", 30*24*time.Hour)
	if err != nil || k.OrgID != o.ID || k.Name != "ci" || k.Key == "" || k.ExpiresAt == nil {
		t.Fatalf("CreateOrgAPIKey: %+v %v", k, err)
	}
	if exp := time.Time(*k.ExpiresAt); exp.Round(0) != exp.Truncate(time.Millisecond) || time.Until(exp) < 29*24*time.Hour {
		t.Fatalf("expires at %v", exp)
	}
	keys, err := svc.ListOrgAPIKeys(ctx, op, o.ID)
	if err != nil || len(keys) != 2 || keys[0].ID != first.ID || keys[1].OrgID != o.ID {
		t.Fatalf("ListOrgAPIKeys: %+v %v", keys, err)
	}
	revoked, err := svc.RevokeAnyAPIKey(ctx, op, k.ID)
	if err != nil || revoked.RevokedAt == nil || revoked.OrgID != o.ID {
		t.Fatalf("RevokeAnyAPIKey: %+v %v", revoked, err)
	}

	ch := f.Channel(t, o.ID, &testenv.ChannelOpts{Connection: f.Connection()})
	st, err := svc.DeactivateChannel(ctx, op, ch.ID)
	if err != nil || st.Status != store.ChannelInactive || st.InactiveReason == nil || *st.InactiveReason != "operator" || st.OrgID != o.ID {
		t.Fatalf("DeactivateChannel: %+v %v", st, err)
	}
	re, err := svc.ReopenChannel(ctx, op, ch.ID, 2*time.Hour)
	if err != nil || re.TokenExpiresAt == nil || re.InactiveReason != nil || time.Until(time.Time(*re.TokenExpiresAt)) < time.Hour {
		t.Fatalf("ReopenChannel of a channel the operator deactivated: %+v %v", re, err)
	}

	wh, _ := f.Webhook(t, o.ID, "https://r.example/h")
	rotated, err := svc.RotateAnyWebhookSecret(ctx, op, wh.ID, time.Hour)
	if err != nil || rotated.HMACSecret == "" || rotated.OrgID != o.ID || rotated.PreviousSecretExpiresAt == nil {
		t.Fatalf("RotateAnyWebhookSecret: %+v %v", rotated, err)
	}
	if _, err := svc.RotateAnyWebhookSecret(ctx, op, uuid.New(), time.Hour); !errors.Is(err, store.ErrWebhookNotFound) {
		t.Fatalf("an unknown webhook: %v", err)
	}
	if _, err := svc.DeactivateChannel(ctx, op, uuid.New()); !errors.Is(err, store.ErrChannelNotFound) {
		t.Fatalf("an unknown channel: %v", err)
	}

	// an API key's principal: refused, nothing done
	p := managementapi.Principal{Key: first}
	refused := func(what string, err error) {
		t.Helper()
		if e, ok := errors.AsType[*managementapi.Error](err); !ok || e.Status != http.StatusForbidden {
			t.Errorf("%s as an API key: %v", what, err)
		}
	}
	_, err = svc.CreateOrg(ctx, p, "x")
	refused("CreateOrg", err)
	_, err = svc.CreateOrgAPIKey(ctx, p, o.ID, "x", 0)
	refused("CreateOrgAPIKey", err)
	_, err = svc.ListOrgAPIKeys(ctx, p, o.ID)
	refused("ListOrgAPIKeys", err)
	_, err = svc.RevokeAnyAPIKey(ctx, p, first.ID)
	refused("RevokeAnyAPIKey", err)
	active := f.Channel(t, o.ID, &testenv.ChannelOpts{Connection: f.Connection()})
	_, err = svc.DeactivateChannel(ctx, p, active.ID)
	refused("DeactivateChannel", err)
	_, err = svc.ReopenChannel(ctx, p, ch.ID, 0)
	refused("ReopenChannel", err)
	_, err = svc.RotateAnyWebhookSecret(ctx, p, wh.ID, 0)
	refused("RotateAnyWebhookSecret", err)
	if c, err := f.Store.GetChannel(ctx, o.ID, active.ID); err != nil || c.Status != store.ChannelActive {
		t.Fatalf("a refused deactivation changed the channel: %+v %v", c, err)
	}
}
