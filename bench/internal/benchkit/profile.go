package benchkit

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
)

// FetchProfile GETs u (a Caddy admin pprof URL) and writes the answer to the file out.
func FetchProfile(ctx context.Context, u, out string) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("%s: %s", resp.Status, b)
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		_ = f.Close() // the copy's error is the one to report
		return err
	}
	return f.Close()
}
