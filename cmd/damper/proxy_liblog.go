package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"

	"github.com/aws/smithy-go/logging"
	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel"
)

// The proxy writes one JSON object a line. The libraries it runs on have
// loggers of their own, which write plain lines to stderr by default: the
// standard log package (net/http, Google's auth library), slog's default
// logger, OpenTelemetry's, the AWS SDK's and go-redis's. Each is routed
// through the proxy's logger instead.

// maxLibraryMessage bounds a library's message in a log line.
const maxLibraryMessage = 2048

// libraryLog is the logger the process-wide loggers write to while a
// proxy runs; nil, they write plain text to stderr, as before.
var libraryLog struct {
	once sync.Once
	to   atomic.Pointer[slog.Logger]
}

// routeLibraryLogs sends the messages of the process-wide loggers (the
// standard log package's, slog's default and OpenTelemetry's) to logger,
// until the function it returns is called.
func routeLibraryLogs(logger *slog.Logger) (stop func()) {
	libraryLog.once.Do(func() {
		h := libraryHandler{}
		slog.SetDefault(slog.New(h)) // the log package's output too, from now on
		slog.SetLogLoggerLevel(slog.LevelWarn)
		otel.SetLogger(logr.FromSlogHandler(h))
	})
	libraryLog.to.Store(logger)
	return func() { libraryLog.to.CompareAndSwap(logger, nil) }
}

// libraryFallback is where library messages go with no proxy running.
var libraryFallback = slog.NewTextHandler(os.Stderr, nil)

// libraryHandler is a slog.Handler that hands each record, its message
// bounded, to the handler of libraryLog's logger at the time.
type libraryHandler struct {
	with []func(slog.Handler) slog.Handler // WithAttrs and WithGroup, in order
}

func (h libraryHandler) target() slog.Handler {
	var t slog.Handler = libraryFallback
	if l := libraryLog.to.Load(); l != nil {
		t = l.Handler()
	}
	for _, f := range h.with {
		t = f(t)
	}
	return t
}

func (h libraryHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.target().Enabled(ctx, level)
}

func (h libraryHandler) Handle(ctx context.Context, r slog.Record) error {
	if len(r.Message) > maxLibraryMessage {
		r.Message = r.Message[:maxLibraryMessage] + "..."
	}
	return h.target().Handle(ctx, r)
}

func (h libraryHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return h.and(func(t slog.Handler) slog.Handler { return t.WithAttrs(attrs) })
}

func (h libraryHandler) WithGroup(name string) slog.Handler {
	return h.and(func(t slog.Handler) slog.Handler { return t.WithGroup(name) })
}

func (h libraryHandler) and(f func(slog.Handler) slog.Handler) libraryHandler {
	return libraryHandler{with: append(h.with[:len(h.with):len(h.with)], f)}
}

// libraryMessage is a library's message, formatted and bounded.
func libraryMessage(format string, v ...any) string {
	msg := fmt.Sprintf(format, v...)
	if len(msg) > maxLibraryMessage {
		msg = msg[:maxLibraryMessage] + "..."
	}
	return msg
}

// awsLogger is the AWS SDK's logger (aws.Config.Logger) writing to
// logger: its WARN messages (such as falling back to IMDSv1) as warnings,
// the rest at debug level.
func awsLogger(logger *slog.Logger) logging.Logger {
	if logger == nil {
		return logging.Nop{}
	}
	return logging.LoggerFunc(func(c logging.Classification, format string, v ...any) {
		level := slog.LevelDebug
		if c == logging.Warn {
			level = slog.LevelWarn
		}
		logger.Log(context.Background(), level, "damper proxy: AWS SDK", "message", libraryMessage(format, v...))
	})
}
