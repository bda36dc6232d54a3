// Package vertexhook lets package dampertest/vertexclient give dampertest
// the SDK's vertex option without dampertest importing the vertex package,
// whose dependencies start a goroutine when a program starts.
package vertexhook

import (
	"net/http"

	"github.com/anthropics/anthropic-sdk-go/v2/option"
)

// Options, once vertexclient is linked in, returns the options that send
// a client's requests through the SDK's vertex package, for project in
// region, with the OAuth access token token, over client. It is set at
// init, before any test reads it.
var Options func(region, project, token string, client *http.Client) []option.RequestOption
