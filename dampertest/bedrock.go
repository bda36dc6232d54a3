package dampertest

import (
	"cmp"
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2/bedrock"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
)

// BedrockAccessKeyID and BedrockSecretKey are the AWS credentials a server
// made with [Bedrock] accepts, and that [Server.Options] signs with. They
// are made up; a test that builds its own aws.Config, with a wrong secret
// for instance, uses them too.
const (
	BedrockAccessKeyID = "AKIADAMPERTEST000000"
	BedrockSecretKey   = "dampertest+secret+key+0000000000000000000"
)

// Bedrock makes the server a fake Amazon Bedrock runtime in region, such
// as us-east-1, for clients built with the SDK's bedrock package (see
// [Server.Options]).
//
// It serves POST /model/{modelId}/invoke and
// /model/{modelId}/invoke-with-response-stream, and checks each request as
// Bedrock would before any step: the path (else 404
// UnknownOperationException); the SigV4 signature, with
// [BedrockAccessKeyID] and [BedrockSecretKey], for region and the bedrock
// service, dated within 5 minutes of time.Now (else 403
// MissingAuthenticationTokenException, UnrecognizedClientException,
// IncompleteSignatureException or InvalidSignatureException); the body, a
// JSON object with anthropic_version, max_tokens and messages, and without
// the model and stream the SDK moves to the path (else 400
// ValidationException). A refusal is Bedrock's: the status, an
// x-amzn-ErrorType header and a {"message": "..."} body; it is logged, with
// its reason in [Request.AuthError], and counted, and takes no step. Expiry
// is checked against time.Now, not the server's clock, because the SDK
// signs with time.Now; inside a testing/synctest bubble both are the
// bubble's, so a request replayed after time.Sleep(6*time.Minute) is stale.
//
// A request that passes is answered by its step as on the first-party
// server, in Bedrock's shape: a message is the same JSON; a stream is sent
// as application/vnd.amazon.eventstream, each event's JSON base64-encoded
// in a chunk frame, and the error event of [FaultErrorEvent] becomes an
// exception frame (see [Stream.ErrorType]); an error status becomes
// Bedrock's (see [Step.Status]). Every answer carries x-amzn-RequestId and
// request-id.
//
// If the environment sets AWS_BEARER_TOKEN_BEDROCK, the SDK's bedrock
// package sends it as a bearer token instead of signing, and the server
// refuses every request with an error that says so: unset it in the test,
// with t.Setenv("AWS_BEARER_TOKEN_BEDROCK", "") before Server.Options.
func Bedrock(region string) ServerOption {
	return func(s *Server) {
		s.platform = platform{name: platformBedrock, region: region}
		if region == "" {
			s.platform.err = "dampertest: the Bedrock region is empty; want one such as us-east-1"
		}
	}
}

// bedrockOptions reaches the server through the SDK's own Bedrock
// adaptation, which signs each request with static credentials: nothing is
// looked up in the environment or on the network.
func (s *Server) bedrockOptions() []option.RequestOption {
	cfg := aws.Config{
		Region:      s.platform.region,
		Credentials: credentials.NewStaticCredentialsProvider(BedrockAccessKeyID, BedrockSecretKey, ""),
	}
	// The base URL comes after bedrock.WithConfig, which sets its own.
	opts := []option.RequestOption{bedrock.WithConfig(cfg), option.WithBaseURL(s.URL())}
	if s.ts == nil {
		opts = append(opts, option.WithHTTPClient(&http.Client{Transport: Transport(s.Handler())}))
	}
	return opts
}

// The operations of the Bedrock runtime the server serves.
const (
	bedrockInvoke = "invoke"
	bedrockStream = "invoke-with-response-stream"
)

// bedrockPath reads the model ID and the operation from the escaped path
// of a request to Bedrock, /model/{modelId}/{operation}. The model ID is
// one escaped segment, so an ARN's slashes are %2F.
func bedrockPath(escaped string) (model, op string, ok bool) {
	parts := strings.Split(escaped, "/")
	if len(parts) != 4 || parts[0] != "" || parts[1] != "model" || parts[2] == "" {
		return "", "", false
	}
	model, err := url.PathUnescape(parts[2])
	if err != nil {
		return "", "", false
	}
	op = parts[3]
	return model, op, op == bedrockInvoke || op == bedrockStream
}

// bedrockInbound checks r as Bedrock would: its path, then its signature,
// then its body.
func (p platform) bedrockInbound(r *http.Request, body []byte) inbound {
	in := inbound{counted: true}
	model, op, ok := bedrockPath(r.URL.EscapedPath())
	in.model, in.stream = model, op == bedrockStream
	if r.Method != http.MethodPost || !ok {
		in.refusal = &refusal{http.StatusNotFound, "UnknownOperationException",
			"dampertest: the fake Bedrock serves POST /model/{modelId}/invoke and POST /model/{modelId}/invoke-with-response-stream, not " +
				r.Method + " " + r.URL.EscapedPath()}
		return in
	}
	v := sigV4{service: "bedrock", region: p.region, accessKey: BedrockAccessKeyID, secretKey: BedrockSecretKey}
	// time.Now, not the server's clock: the SDK signs with time.Now.
	in.signedAt, in.signature, in.refusal = v.verify(r, body, time.Now())
	if in.refusal != nil {
		return in
	}
	if problem := checkBody(body, "model", "stream"); problem != "" {
		in.refusal = &refusal{http.StatusBadRequest, "ValidationException",
			"Malformed input request: #: " + problem + ", please reformat your input and try again."}
	}
	return in
}

// anthropicErrorTypes are the error types of the first-party API, which
// Bedrock does not send: a step's ErrorType among them is replaced by
// Bedrock's own name for its status.
var anthropicErrorTypes = map[string]bool{
	"invalid_request_error": true, "authentication_error": true, "billing_error": true,
	"permission_error": true, "not_found_error": true, "request_too_large": true,
	"rate_limit_error": true, "api_error": true, "overloaded_error": true,
}

// bedrockError returns the status and x-amzn-ErrorType with which Bedrock
// answers where the API answers status. An errorType other than the API's
// own is taken as a name of Bedrock's, such as ModelNotReadyException, and
// kept. Bedrock has no 529: an overloaded model is a 503.
func bedrockError(status int, errorType string) (int, string) {
	if status == 529 {
		status = http.StatusServiceUnavailable
	}
	if errorType != "" && !anthropicErrorTypes[errorType] {
		return status, errorType
	}
	switch {
	case status == http.StatusBadRequest:
		return status, "ValidationException"
	case status == http.StatusUnauthorized:
		return status, "UnrecognizedClientException"
	case status == http.StatusForbidden:
		return status, "AccessDeniedException"
	case status == http.StatusNotFound:
		return status, "ResourceNotFoundException"
	case status == http.StatusRequestTimeout:
		return status, "ModelTimeoutException"
	case status == http.StatusFailedDependency:
		return status, "ModelErrorException"
	case status == http.StatusTooManyRequests:
		return status, "ThrottlingException"
	case status == http.StatusServiceUnavailable:
		return status, "ServiceUnavailableException"
	case status >= 500:
		return status, "InternalServerException"
	}
	return status, "ValidationException"
}

// bedrockMessages are Bedrock's usual wording, keyed by the error type with
// its first letter in lower case, as stream exceptions spell it.
var bedrockMessages = map[string]string{
	"validationException":           "Malformed input request, please reformat your input and try again.",
	"unrecognizedClientException":   "The security token included in the request is invalid.",
	"accessDeniedException":         "You don't have access to the model with the specified model ID.",
	"resourceNotFoundException":     "Could not resolve the foundation model from the provided model identifier.",
	"modelTimeoutException":         "Model has timed out in processing the request. Try your request again.",
	"modelErrorException":           "The model returned an error. Try your request again.",
	"modelNotReadyException":        "The model is not ready to serve inference requests. Try your request again.",
	"throttlingException":           "Too many requests, please wait before trying again.",
	"serviceUnavailableException":   "Bedrock is unable to process your request.",
	"internalServerException":       "The system encountered an unexpected error during processing. Try your request again.",
	"modelStreamErrorException":     "The model encountered an error while streaming its response.",
	"serviceQuotaExceededException": "Your request exceeds the service quota for your account.",
}

// bedrockMessage is the default message of a Bedrock error type.
func bedrockMessage(kind string) string {
	if kind == "" {
		return ""
	}
	key := strings.ToLower(kind[:1]) + kind[1:]
	return cmp.Or(bedrockMessages[key], "dampertest: scripted "+kind)
}

// writeBedrockError sends Bedrock's error shape: the type in a header, the
// message alone in the body.
func (s *Server) writeBedrockError(ctx context.Context, w http.ResponseWriter, status int, kind, msg string, drop Drop) {
	setDefault(w.Header(), "X-Amzn-Errortype", kind)
	s.writeBody(ctx, w, status, marshal(struct {
		Message string `json:"message"`
	}{cmp.Or(msg, bedrockMessage(kind))}), drop)
}

// setBedrockUsage adds the usage headers Bedrock sends with a message.
func setBedrockUsage(h http.Header, inputTokens, outputTokens int) {
	setDefault(h, "X-Amzn-Bedrock-Input-Token-Count", strconv.Itoa(inputTokens))
	setDefault(h, "X-Amzn-Bedrock-Output-Token-Count", strconv.Itoa(outputTokens))
}
