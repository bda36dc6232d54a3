# The damper command as an image: one static binary, the CA certificates
# and a non-root user, nothing else (no shell, no package manager).
#
#   docker build -t damper .
#   docker run --rm damper version
#   docker run --rm -p 8787:8787 -p 9464:9464 -v "$PWD/proxy.yaml:/etc/damper/proxy.yaml:ro" \
#     damper proxy -config /etc/damper/proxy.yaml
#
# In the image the proxy listens where its file says: 127.0.0.1:8787 by
# default, which a sidecar's app reaches over the pod's loopback; give
# listen: 0.0.0.0:8787 to publish the port. Its probes are /healthz and
# /readyz, on admin_listen (9464 in the examples) when set.

FROM golang:1.26 AS build
WORKDIR /src
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /out/damper ./cmd/damper
RUN echo 'damper:x:65532:65532:damper:/:/damper' > /out/passwd && echo 'damper:x:65532:' > /out/group

FROM scratch
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/passwd /etc/passwd
COPY --from=build /out/group /etc/group
COPY --from=build /out/damper /damper
USER 65532:65532
EXPOSE 8787 9464
ENTRYPOINT ["/damper"]
CMD ["help"]
