package caddymodule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
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
		Usage: "<migrate|org|apikey|channel> ...",
		Short: "Manage the wabarelay database: migrations, orgs, API keys, channels",
		Long: `
Operator commands for wabarelay. The database comes from --database or the
WABARELAY_DATABASE_URL environment variable; commands that read or write
secrets need --encryption-key or WABARELAY_ENCRYPTION_KEY (none of the current
ones do: API keys are stored hashed, and channel commands print no secret).
Output is one JSON object per line.`,
		CobraFunc: func(cmd *cobra.Command) {
			cmd.PersistentFlags().String("database", "", "Postgres connection string (default $WABARELAY_DATABASE_URL)")
			cmd.PersistentFlags().String("encryption-key", "", "base64 encryption key (default $WABARELAY_ENCRYPTION_KEY)")
			cmd.AddCommand(cliMigrate(), cliOrg(), cliAPIKey(), cliChannel())
		},
	})
}

// cliEnv is what a CLI command runs with.
type cliEnv struct {
	ctx   context.Context
	store *store.Store
	out   *json.Encoder
}

// runCLI wraps a command body: it opens the database (and the secret box when needed) and
// turns errors into exit status 1 with a one-line message.
func runCLI(needKey bool, fn func(env *cliEnv, cmd *cobra.Command) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, _ []string) error {
		cmd.SilenceUsage = true
		ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Minute)
		defer cancel()
		dsn := flagOrEnv(cmd, "database", "WABARELAY_DATABASE_URL")
		if dsn == "" {
			return errors.New("no database: pass --database or set WABARELAY_DATABASE_URL")
		}
		var box *secretbox.Box
		if needKey {
			raw := flagOrEnv(cmd, "encryption-key", "WABARELAY_ENCRYPTION_KEY")
			if raw == "" {
				return errors.New("no encryption key: pass --encryption-key or set WABARELAY_ENCRYPTION_KEY")
			}
			key, err := secretbox.ParseKey(raw)
			if err != nil {
				return fmt.Errorf("encryption key (--encryption-key or WABARELAY_ENCRYPTION_KEY): %w", err)
			}
			if box, err = secretbox.New(key); err != nil {
				return err
			}
		}
		cfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			return errors.New("database: invalid connection string")
		}
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return fmt.Errorf("database: %w", err)
		}
		defer pool.Close()
		return fn(&cliEnv{ctx: ctx, store: store.New(pool, box), out: json.NewEncoder(cmd.OutOrStdout())}, cmd)
	}
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
			o, err := env.store.CreateOrg(env.ctx, name)
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

// apiKeyCreated is the output of `apikey create`: the record plus the key, shown this once.
type apiKeyCreated struct {
	store.APIKey
	Key string `json:"key"`
}

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
			var expiresAt *time.Time
			if s, _ := cmd.Flags().GetString("expires-in"); s != "" {
				d, err := managementapi.ParseLifetime(s)
				if err != nil || d <= 0 {
					return fmt.Errorf("--expires-in: invalid duration %q", s)
				}
				t := time.Now().Add(d).UTC().Truncate(time.Millisecond)
				expiresAt = &t
			}
			k, key, err := env.store.CreateAPIKey(env.ctx, orgID, name, expiresAt)
			if err != nil {
				return err
			}
			return env.out.Encode(apiKeyCreated{APIKey: k, Key: key})
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
			keys, err := env.store.ListAPIKeys(env.ctx, orgID)
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
			k, err := env.store.RevokeAPIKey(env.ctx, id)
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

// channelState is the CLI's view of a channel: no tokens.
type channelState struct {
	ID             uuid.UUID `json:"id"`
	OrgID          uuid.UUID `json:"org_id"`
	Name           string    `json:"name"`
	Status         string    `json:"status"`
	InactiveReason *string   `json:"inactive_reason"`
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
			c, err := env.store.DeactivateChannel(env.ctx, id)
			if err != nil {
				return err
			}
			return env.out.Encode(channelState{ID: c.ID, OrgID: c.OrgID, Name: c.Name, Status: c.Status, InactiveReason: c.InactiveReason})
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
			c, err := env.store.ReopenLink(env.ctx, nil, id, ttl, true)
			if err != nil {
				return err
			}
			return env.out.Encode(struct {
				channelState
				TokenExpiresAt *time.Time `json:"token_expires_at"`
			}{channelState{ID: c.ID, OrgID: c.OrgID, Name: c.Name, Status: c.Status, InactiveReason: c.InactiveReason}, c.TokenExpiresAt})
		}),
	}
	reconnect.Flags().String("id", "", "channel id")
	reconnect.Flags().String("ttl", "", "how long the link stays open (default 168h)")
	channel.AddCommand(deactivate, reconnect)
	return channel
}
