/* The least a NATS responder can do, on the NATS C client (libnats): answers every request
 * on SUBJECT with one fixed reply, and nothing else. Beside a machina-toolhost --nats host
 * it measures what the broker and the client library alone allow on this machine.
 *
 *   nats_null_responder [-q QUEUE] [-r REPLY] [-B] URL SUBJECT
 *
 * Replies go out at once (each publish written to the socket), as the host's do, or with
 * -B buffered by the client's flusher. Prints "ready" on stdout once the server has the
 * subscription; serves until its standard input closes (or a signal ends it). */
#include <nats/nats.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char* reply_body =
    "{\"ok\":true,\"status\":\"OK\",\"output_json\":\"{\\\"msg\\\":\\\"hello\\\",\\\"n\\\":1}\",\"ds_delta\":[]}";
static int reply_len;

static void on_request(natsConnection* nc, natsSubscription* sub, natsMsg* msg, void* closure) {
  (void)sub, (void)closure;
  const char* reply = natsMsg_GetReply(msg);
  if (reply != NULL && *reply != '\0') natsConnection_Publish(nc, reply, reply_body, reply_len);
  natsMsg_Destroy(msg);
}

int main(int argc, char** argv) {
  const char* queue = NULL;
  bool asap = true;
  int opt;
  while ((opt = getopt(argc, argv, "q:r:B")) != -1) {
    switch (opt) {
      case 'q': queue = optarg; break;
      case 'r': reply_body = optarg; break;
      case 'B': asap = false; break;
      default: fprintf(stderr, "usage: nats_null_responder [-q QUEUE] [-r REPLY] [-B] URL SUBJECT\n"); return 2;
    }
  }
  if (optind != argc - 2) {
    fprintf(stderr, "usage: nats_null_responder [-q QUEUE] [-r REPLY] [-B] URL SUBJECT\n");
    return 2;
  }
  reply_len = (int)strlen(reply_body);
  natsOptions* opts = NULL;
  natsConnection* nc = NULL;
  natsSubscription* sub = NULL;
  natsStatus s = natsOptions_Create(&opts);
  if (s == NATS_OK) s = natsOptions_SetURL(opts, argv[optind]);
  if (s == NATS_OK) s = natsOptions_SetSendAsap(opts, asap);
  if (s == NATS_OK) s = natsConnection_Connect(&nc, opts);
  if (s == NATS_OK) {
    s = queue ? natsConnection_QueueSubscribe(&sub, nc, argv[optind + 1], queue, on_request, NULL)
              : natsConnection_Subscribe(&sub, nc, argv[optind + 1], on_request, NULL);
  }
  if (s == NATS_OK) s = natsSubscription_SetPendingLimits(sub, -1, -1);
  if (s == NATS_OK) s = natsConnection_FlushTimeout(nc, 5000);
  if (s != NATS_OK) {
    fprintf(stderr, "nats_null_responder: %s: %s\n", argv[optind], natsStatus_GetText(s));
    return 2;
  }
  printf("ready\n");
  fflush(stdout);
  char buf[256];
  while (read(STDIN_FILENO, buf, sizeof buf) > 0) {
  }
  natsSubscription_Unsubscribe(sub);
  natsSubscription_Destroy(sub);
  natsConnection_Destroy(nc);
  natsOptions_Destroy(opts);
  return 0;
}
