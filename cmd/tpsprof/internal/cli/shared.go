package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/tpsprof/tpsprof/collector"
	"github.com/tpsprof/tpsprof/natsconn"
)

// natsFlags registers the connection flags agent, collector and launch share.
// Secrets can come from the environment instead of the command line, where
// other users could read them.
func natsFlags(fs *flagSet, o *natsconn.Options) {
	fs.StringVar(&o.URL, "nats", "", "NATS server URL, e.g. nats://10.0.0.5:4222 (tls:// for TLS)")
	fs.StringVar(&o.User, "nats-user", "", "NATS user name")
	fs.StringVar(&o.CredsFile, "nats-creds", "", "NATS credentials file (JWT and NKey seed)")
	fs.StringVar(&o.NKeyFile, "nats-nkey", "", "NATS NKey seed file")
	fs.StringVar(&o.TLSCA, "nats-tls-ca", "", "CA certificate that signed the NATS server's certificate")
	fs.StringVar(&o.TLSCert, "nats-tls-cert", "", "client certificate for mutual TLS")
	fs.StringVar(&o.TLSKey, "nats-tls-key", "", "client key for mutual TLS")
}

// natsSecrets reads password and token from the environment.
func natsSecrets(o *natsconn.Options) {
	o.Password = os.Getenv("TPSPROF_NATS_PASSWORD")
	o.Token = os.Getenv("TPSPROF_NATS_TOKEN")
}

// natsClientSecrets is natsSecrets for agents and launch: with no
// credentials given at all, the token a collector of the same user wrote
// for its embedded server (natsconn.TokenPath) is used.
func natsClientSecrets(o *natsconn.Options) {
	natsSecrets(o)
	if o.User == "" && o.Token == "" && o.CredsFile == "" && o.NKeyFile == "" {
		o.Token = natsconn.LocalToken()
	}
}

const natsEnvHelp = "\nSecrets come from the environment, never from flags: TPSPROF_NATS_PASSWORD (with --nats-user), TPSPROF_NATS_TOKEN.\n" +
	"With none given, agents and launch use the token a collector of the same user wrote for its embedded server (~/.config/tpsprof/nats-token).\n"

func newLogger(w io.Writer, verbose bool) *slog.Logger {
	lvl := slog.LevelInfo
	if verbose {
		lvl = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: lvl}))
}

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
}

func printJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// serveHTTP serves h on addr and returns its base URL and a stop function.
func serveHTTP(addr string, h http.Handler) (string, func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, err
	}
	srv, lim := collector.NewHTTPServer(h, ln, 0)
	go srv.Serve(lim)
	return "http://" + ln.Addr().String() + "/", func() { srv.Close() }, nil
}

func splitHostPort(s string) (string, int, error) {
	i := strings.LastIndex(s, ":")
	if i < 0 {
		return "", 0, fmt.Errorf("%q is not HOST:PORT", s)
	}
	var port int
	if _, err := fmt.Sscanf(s[i+1:], "%d", &port); err != nil || port < -1 || port > 65535 {
		return "", 0, fmt.Errorf("%q: bad port", s)
	}
	return s[:i], port, nil
}

// envOr is the environment variable's value, or def where it is unset.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// progressPrinter redraws one progress line at most ten times a second.
func progressPrinter(w io.Writer) func(done, total int64) {
	var last time.Time
	return func(done, total int64) {
		if time.Since(last) < 100*time.Millisecond && done < total {
			return
		}
		last = time.Now()
		if total > 0 {
			fmt.Fprintf(w, "\rreading rank_steps: %d of %d rows (%.0f%%)", done, total, 100*float64(done)/float64(total))
		} else {
			fmt.Fprintf(w, "\rreading rank_steps: %d rows", done)
		}
	}
}
