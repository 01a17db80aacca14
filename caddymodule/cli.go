package caddymodule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/wabarelay/wabarelay/managementapi"
	"github.com/wabarelay/wabarelay/secretbox"
	"github.com/wabarelay/wabarelay/store"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "wabarelay",
		Usage: "<migrate|org|apikey|channel|webhook|rekey> ...",
		Short: "Manage the wabarelay database: migrations, orgs, API keys, channels, webhook secrets, key rotation",
		Long: `
Operator commands for wabarelay. The database comes from --database or the
WABARELAY_DATABASE_URL environment variable; commands that read or write
secrets (webhook rotate-secret, rekey) need the encryption keys: --encryption-key (repeatable, or
comma-separated) or WABARELAY_ENCRYPTION_KEY (separated by commas and/or
spaces), the first being the one that encrypts. API keys are stored hashed, and
channel commands print no secret, so those need no key.
Output is one JSON object per line.`,
		CobraFunc: func(cmd *cobra.Command) {
			cmd.PersistentFlags().String("database", "", "Postgres connection string (default $WABARELAY_DATABASE_URL)")
			cmd.PersistentFlags().StringArray("encryption-key", nil, "base64 encryption key; repeat it or separate keys with commas, the first encrypts (default $WABARELAY_ENCRYPTION_KEY)")
			cmd.AddCommand(cliMigrate(), cliOrg(), cliAPIKey(), cliChannel(), cliWebhook(), cliRekey())
		},
	})
}

// cliEnv is what a CLI command runs with. The commands on orgs, API keys, channels and
// webhooks are operations of the management Service made as the operator's principal
// (managementapi.Operator), printed in its shapes; migrate and rekey work on the database
// itself (its schema, its encryption at rest), as the app's start does, and so on the store.
type cliEnv struct {
	ctx   context.Context
	store *store.Store
	svc   *managementapi.Service
	out   *json.Encoder
}

// operator is the CLI's principal.
var operator = managementapi.Operator()

// cliTimeout bounds a CLI command (except rekey, which runs until done or interrupted).
const cliTimeout = 2 * time.Minute

// runCLI wraps a command body: it opens the database (and the secret box when needed) and
// turns errors into exit status 1 with a one-line message.
func runCLI(needKey bool, fn func(env *cliEnv, cmd *cobra.Command) error) func(*cobra.Command, []string) error {
	return runCLIFor(needKey, cliTimeout, fn)
}

// runCLIFor is runCLI with a timeout; 0 means none.
func runCLIFor(needKey bool, timeout time.Duration, fn func(env *cliEnv, cmd *cobra.Command) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, _ []string) error {
		cmd.SilenceUsage = true
		ctx, cancel := context.WithCancel(cmd.Context())
		defer cancel()
		if timeout > 0 {
			var cancelTimeout context.CancelFunc
			ctx, cancelTimeout = context.WithTimeout(ctx, timeout)
			defer cancelTimeout()
		}
		dsn := flagOrEnv(cmd, "database", "WABARELAY_DATABASE_URL")
		if dsn == "" {
			return errors.New("no database: pass --database or set WABARELAY_DATABASE_URL")
		}
		var box *secretbox.Box
		if needKey {
			var err error
			if box, err = cliKeyring(cmd); err != nil {
				return err
			}
		}
		cfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			return errors.New("database: invalid connection string")
		}
		store.ConfigurePool(cfg)
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return fmt.Errorf("database: %w", err)
		}
		defer pool.Close()
		st := store.New(pool, box)
		svc := managementapi.NewService(managementapi.Options{Store: st, ConnectLinkTTL: DefaultConnectLinkTTL})
		return fn(&cliEnv{ctx: ctx, store: st, svc: svc, out: json.NewEncoder(cmd.OutOrStdout())}, cmd)
	}
}

// cliKeyring reads the encryption keys from --encryption-key (repeatable, each a comma-separated
// list) or else WABARELAY_ENCRYPTION_KEY (separated by commas and/or whitespace). Errors name
// the setting, never a key.
func cliKeyring(cmd *cobra.Command) (*secretbox.Box, error) {
	raw := os.Getenv("WABARELAY_ENCRYPTION_KEY")
	if flags, _ := cmd.Flags().GetStringArray("encryption-key"); len(flags) > 0 {
		raw = strings.Join(flags, ",")
	}
	if strings.TrimSpace(raw) == "" {
		return nil, errors.New("no encryption key: pass --encryption-key or set WABARELAY_ENCRYPTION_KEY")
	}
	keys, err := secretbox.ParseKeys(raw)
	if err != nil {
		return nil, fmt.Errorf("encryption key (--encryption-key or WABARELAY_ENCRYPTION_KEY): %w", err)
	}
	box, err := secretbox.NewKeyring(keys...)
	if err != nil {
		return nil, fmt.Errorf("encryption key (--encryption-key or WABARELAY_ENCRYPTION_KEY): %w", err)
	}
	return box, nil
}

func flagOrEnv(cmd *cobra.Command, flag, env string) string {
	if v, _ := cmd.Flags().GetString(flag); v != "" {
		return v
	}
	return os.Getenv(env)
}

func uuidFlag(cmd *cobra.Command, name string) (uuid.UUID, error) {
	s, _ := cmd.Flags().GetString(name)
	id, err := uuid.Parse(s)
	if err != nil {
		return uuid.UUID{}, fmt.Errorf("--%s must be a UUID", name)
	}
	return id, nil
}

func cliMigrate() *cobra.Command {
	return &cobra.Command{
		Use:   "migrate",
		Short: "Apply pending schema migrations (safe to run concurrently)",
		RunE: runCLI(false, func(env *cliEnv, _ *cobra.Command) error {
			conn, err := env.store.Pool().Acquire(env.ctx)
			if err != nil {
				return fmt.Errorf("database: %w", err)
			}
			defer conn.Release()
			if err := store.Migrate(env.ctx, conn.Conn()); err != nil {
				return err
			}
			current, latest, err := store.SchemaVersion(env.ctx, conn.Conn())
			if err != nil {
				return err
			}
			return env.out.Encode(map[string]any{"schema_version": current, "latest_version": latest})
		}),
	}
}

func cliOrg() *cobra.Command {
	org := &cobra.Command{Use: "org", Short: "Manage organizations"}
	create := &cobra.Command{
		Use:   "create --name NAME",
		Short: "Create an organization",
		RunE: runCLI(false, func(env *cliEnv, cmd *cobra.Command) error {
			name, _ := cmd.Flags().GetString("name")
			if name == "" {
				return errors.New("--name is required")
			}
			o, err := env.svc.CreateOrg(env.ctx, operator, name)
			if err != nil {
				return err
			}
			return env.out.Encode(o)
		}),
	}
	create.Flags().String("name", "", "organization name")
	org.AddCommand(create)
	return org
}

// The CLI writes the management API's shapes (managementapi: Org, OrgAPIKey, ChannelState,
// OrgWebhook), timestamps as the API does (RFC 3339 in UTC with milliseconds), never in the
// machine's time zone or to the database's microsecond.

func cliAPIKey() *cobra.Command {
	apikey := &cobra.Command{Use: "apikey", Short: "Manage API keys"}
	create := &cobra.Command{
		Use:   "create --org ORG_ID [--name N] [--expires-in DURATION]",
		Short: "Create an API key (printed once; only its hash is stored; the per-org cap does not apply)",
		RunE: runCLI(false, func(env *cliEnv, cmd *cobra.Command) error {
			orgID, err := uuidFlag(cmd, "org")
			if err != nil {
				return err
			}
			name, _ := cmd.Flags().GetString("name")
			var lifetime time.Duration // none: no expiry
			if s, _ := cmd.Flags().GetString("expires-in"); s != "" {
				if lifetime, err = managementapi.ParseLifetime(s); err != nil || lifetime <= 0 {
					return fmt.Errorf("--expires-in: invalid duration %q", s)
				}
			}
			k, err := env.svc.CreateOrgAPIKey(env.ctx, operator, orgID, name, lifetime)
			if err != nil {
				return err
			}
			return env.out.Encode(k)
		}),
	}
	create.Flags().String("org", "", "organization id")
	create.Flags().String("name", "", "a name to recognise the key by")
	create.Flags().String("expires-in", "", "lifetime, e.g. 720h or 90d (default: no expiry)")

	list := &cobra.Command{
		Use:   "list --org ORG_ID",
		Short: "List an organization's API keys (prefixes only)",
		RunE: runCLI(false, func(env *cliEnv, cmd *cobra.Command) error {
			orgID, err := uuidFlag(cmd, "org")
			if err != nil {
				return err
			}
			keys, err := env.svc.ListOrgAPIKeys(env.ctx, operator, orgID)
			if err != nil {
				return err
			}
			return encodeAll(env.out, keys)
		}),
	}
	list.Flags().String("org", "", "organization id")

	revoke := &cobra.Command{
		Use:   "revoke --id KEY_ID",
		Short: "Revoke an API key",
		RunE: runCLI(false, func(env *cliEnv, cmd *cobra.Command) error {
			id, err := uuidFlag(cmd, "id")
			if err != nil {
				return err
			}
			k, err := env.svc.RevokeAnyAPIKey(env.ctx, operator, id)
			if err != nil {
				return err
			}
			return env.out.Encode(k)
		}),
	}
	revoke.Flags().String("id", "", "API key id")
	apikey.AddCommand(create, list, revoke)
	return apikey
}

func encodeAll[T any](enc *json.Encoder, items []T) error {
	for _, it := range items {
		if err := enc.Encode(it); err != nil {
			return err
		}
	}
	return nil
}

func cliChannel() *cobra.Command {
	channel := &cobra.Command{Use: "channel", Short: "Operator actions on channels"}
	deactivate := &cobra.Command{
		Use:   "deactivate --id CHANNEL_ID",
		Short: "Deactivate a channel (the relay then answers 403)",
		RunE: runCLI(false, func(env *cliEnv, cmd *cobra.Command) error {
			id, err := uuidFlag(cmd, "id")
			if err != nil {
				return err
			}
			c, err := env.svc.DeactivateChannel(env.ctx, operator, id)
			if err != nil {
				return err
			}
			return env.out.Encode(c)
		}),
	}
	deactivate.Flags().String("id", "", "channel id")
	reconnect := &cobra.Command{
		Use:   "reconnect --id CHANNEL_ID [--ttl DURATION]",
		Short: "Reopen a channel's connect link (also for channels an operator deactivated)",
		RunE: runCLI(false, func(env *cliEnv, cmd *cobra.Command) error {
			id, err := uuidFlag(cmd, "id")
			if err != nil {
				return err
			}
			ttl := DefaultConnectLinkTTL
			if s, _ := cmd.Flags().GetString("ttl"); s != "" {
				if ttl, err = caddy.ParseDuration(s); err != nil || ttl <= 0 {
					return fmt.Errorf("--ttl: invalid duration %q", s)
				}
			}
			c, err := env.svc.ReopenChannel(env.ctx, operator, id, ttl)
			if err != nil {
				return err
			}
			return env.out.Encode(c)
		}),
	}
	reconnect.Flags().String("id", "", "channel id")
	reconnect.Flags().String("ttl", "", "how long the link stays open (default 168h)")
	channel.AddCommand(deactivate, reconnect)
	return channel
}

func cliWebhook() *cobra.Command {
	webhook := &cobra.Command{Use: "webhook", Short: "Operator actions on webhooks"}
	rotate := &cobra.Command{
		Use:   "rotate-secret --id WEBHOOK_ID [--grace DURATION]",
		Short: "Give a webhook a new signing secret (printed once); the old one also signs until the grace ends",
		RunE: runCLI(true, func(env *cliEnv, cmd *cobra.Command) error {
			id, err := uuidFlag(cmd, "id")
			if err != nil {
				return err
			}
			grace := store.DefaultSecretGrace
			if s, _ := cmd.Flags().GetString("grace"); s != "" {
				if grace, err = caddy.ParseDuration(s); err != nil || grace < 0 || grace > store.MaxSecretGrace {
					return fmt.Errorf("--grace: %q is not a duration between 0s and %v", s, store.MaxSecretGrace)
				}
			}
			w, err := env.svc.RotateAnyWebhookSecret(env.ctx, operator, id, grace)
			if err != nil {
				return err
			}
			return env.out.Encode(w)
		}),
	}
	rotate.Flags().String("id", "", "webhook id")
	rotate.Flags().String("grace", "", "how long the old secret keeps signing, 0s to 168h (default 24h)")
	webhook.AddCommand(rotate)
	return webhook
}

// rekeySummary is the last line of `rekey`.
type rekeySummary struct {
	Result string `json:"result"` // "complete" or "incomplete"
	store.RekeyResult
	// KeyID names the key everything is now encrypted under (not secret).
	KeyID string `json:"key_id"`
}

func cliRekey() *cobra.Command {
	rekey := &cobra.Command{
		Use:   "rekey [--batch-size N]",
		Short: "Re-encrypt every stored secret under the first encryption key (key rotation)",
		Long: `
Re-encrypts every stored secret (channel tokens, upstream access tokens,
registration PINs, webhook signing secrets) that is not yet under the first
encryption key, in transactions of --batch-size values. Each value is written
only if it is unchanged since it was read, so it is safe while instances run;
values already under the first key are skipped, so an interrupted run is
finished by running it again. Every instance must already list the new key
first (see docs/operations.md, "Rotating the encryption key").

Prints one JSON line per batch, {"table","column","done","total"}, then a
summary {"result","rekeyed","concurrent","unreadable","remaining","key_id"}.
Exits non-zero when values remain that no listed key opens.`,
		RunE: runCLIFor(true, 0, func(env *cliEnv, cmd *cobra.Command) error {
			batch, _ := cmd.Flags().GetInt("batch-size")
			if batch <= 0 {
				return errors.New("--batch-size must be a positive integer")
			}
			ctx, stop := signal.NotifyContext(env.ctx, os.Interrupt, syscall.SIGTERM)
			defer stop()
			var outErr error
			res, err := env.store.Rekey(ctx, store.RekeyOptions{BatchSize: batch, Progress: func(p store.RekeyProgress) {
				if e := env.out.Encode(p); e != nil && outErr == nil {
					outErr = e
				}
			}})
			if err != nil && !errors.Is(err, store.ErrRekeyIncomplete) {
				return fmt.Errorf("rekey interrupted after %d values (run it again to finish): %w", res.Rekeyed, err)
			}
			sum := rekeySummary{Result: "complete", RekeyResult: res, KeyID: env.store.Box().KeyIDs()[0]}
			if err != nil {
				sum.Result = "incomplete"
			}
			if e := env.out.Encode(sum); e != nil && outErr == nil {
				outErr = e
			}
			if err != nil {
				return err
			}
			return outErr
		}),
	}
	rekey.Flags().Int("batch-size", store.DefaultRekeyBatch, "values re-encrypted per transaction")
	return rekey
}
