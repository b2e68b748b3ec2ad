/*
 * Paced producer and timing consumer for the latency scenario (bench/scenarios.py, 3).
 * Not a test. Written in C so that the clients take almost no CPU: on a 2-core machine
 * two Python clients at a few thousand messages per second leave the broker and the
 * intermediary waiting for a core, and the latency measured is then the clients' queue.
 *
 *   latency send    HOST PORT ADDRESS COUNT RATE   COUNT messages at RATE msg/s
 *   latency receive HOST PORT ADDRESS COUNT        COUNT messages, credit window 100
 *
 * Messages are at-least-once, 100-byte binary body, with the application property
 * "sent_at" = wall-clock seconds (double) stamped just before the transfer is written.
 * The sender paces on a 1 ms proactor timeout: each tick sends what is due
 * (elapsed x RATE, less what was sent) as far as credit allows.
 *
 * Each prints one JSON line when done, like bench/pyclients.py: "role", "count",
 * "first", "last" (wall-clock seconds of the first transfer / the last outcome or
 * message), "error" (null when all went well); the receiver adds "latencies_ms", the
 * reception time minus sent_at of every message, in order of arrival.
 */

#include <proton/condition.h>
#include <proton/connection.h>
#include <proton/delivery.h>
#include <proton/link.h>
#include <proton/message.h>
#include <proton/proactor.h>
#include <proton/session.h>
#include <proton/transport.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BODY_SIZE 100
#define CREDIT_WINDOW 100
#define TICK_MS 1

typedef struct {
  bool sending;
  const char *address;
  long count;
  double rate;

  pn_proactor_t *proactor;
  pn_connection_t *connection;
  pn_link_t *link;
  pn_message_t *message;
  pn_rwbytes_t buffer;

  bool closed;
  long sent, settled, accepted, received;
  double first, last;
  double *latencies_ms;
  char error[512];
} client_t;

static double wall_clock(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void fail(client_t *c, const char *what, pn_condition_t *cond) {
  if (!c->error[0]) {
    snprintf(c->error, sizeof c->error, "%s: %s: %s", what,
             cond ? pn_condition_get_name(cond) : "", cond ? pn_condition_get_description(cond) : "");
  }
  if (c->connection) pn_connection_close(c->connection);
}

static void check(client_t *c, const char *what, pn_condition_t *cond) {
  if (pn_condition_is_set(cond)) fail(c, what, cond);
}

/* Send what the clock says is due, as far as credit allows. */
static void send_due(client_t *c) {
  if (!c->link || c->sent >= c->count) return;
  double now = wall_clock();
  if (!c->first) c->first = now;
  long due = (long)((now - c->first) * c->rate) + 1;
  if (due > c->count) due = c->count;
  static char body[BODY_SIZE];
  if (!body[0]) memset(body, 'x', sizeof body); /* once: every message carries the same body */
  while (c->sent < due && pn_link_credit(c->link) > 0) {
    long tag = c->sent;
    pn_delivery(c->link, pn_dtag((const char *)&tag, sizeof tag));
    pn_message_clear(c->message);
    pn_message_set_durable(c->message, false);
    pn_data_put_binary(pn_message_body(c->message), pn_bytes(sizeof body, body));
    pn_data_t *props = pn_message_properties(c->message);
    pn_data_put_map(props);
    pn_data_enter(props);
    pn_data_put_string(props, pn_bytes(7, "sent_at"));
    pn_data_put_double(props, wall_clock());
    pn_data_exit(props);
    if (pn_message_send(c->message, c->link, &c->buffer) < 0) {
      snprintf(c->error, sizeof c->error, "encoding: %s", pn_error_text(pn_message_error(c->message)));
      pn_connection_close(c->connection);
      return;
    }
    c->sent++;
  }
}

static void receive(client_t *c, pn_delivery_t *d) {
  if (!pn_delivery_readable(d) || pn_delivery_partial(d)) return;
  double now = wall_clock();
  size_t size = pn_delivery_pending(d);
  if (size > c->buffer.size) {
    c->buffer.start = realloc(c->buffer.start, size);
    c->buffer.size = size;
  }
  pn_link_t *link = pn_delivery_link(d);
  ssize_t got = pn_link_recv(link, c->buffer.start, size);
  pn_link_advance(link);
  double sent_at = -1;
  if (got >= 0 && pn_message_decode(c->message, c->buffer.start, (size_t)got) == 0) {
    pn_data_t *props = pn_message_properties(c->message);
    pn_data_rewind(props);
    if (pn_data_next(props) && pn_data_type(props) == PN_MAP) {
      pn_data_enter(props);
      while (pn_data_next(props)) {
        pn_bytes_t key = pn_data_get_string(props);
        bool match = key.size == 7 && memcmp(key.start, "sent_at", 7) == 0;
        if (!pn_data_next(props)) break;
        if (match && pn_data_type(props) == PN_DOUBLE) sent_at = pn_data_get_double(props);
      }
    }
  }
  pn_delivery_update(d, PN_ACCEPTED);
  pn_delivery_settle(d);
  if (sent_at < 0) {
    snprintf(c->error, sizeof c->error, "message %ld has no sent_at", c->received);
    pn_connection_close(c->connection);
    return;
  }
  if (!c->first) c->first = now;
  c->last = now;
  c->latencies_ms[c->received++] = 1000.0 * (now - sent_at);
  if (c->received == c->count) {
    pn_connection_close(c->connection);
  } else if (pn_link_credit(link) < CREDIT_WINDOW / 2) {
    pn_link_flow(link, CREDIT_WINDOW - pn_link_credit(link));
  }
}

static void outcome(client_t *c, pn_delivery_t *d) {
  if (!pn_delivery_updated(d)) return;
  uint64_t state = pn_delivery_remote_state(d);
  if (state == PN_ACCEPTED) {
    c->accepted++;
  } else if (!c->error[0]) {
    snprintf(c->error, sizeof c->error, "delivery %ld: outcome %s", c->settled,
             pn_disposition_type_name(state));
  }
  pn_delivery_settle(d);
  c->last = wall_clock();
  if (++c->settled == c->count) pn_connection_close(c->connection);
}

/* Returns false when the proactor has nothing left to do. */
static bool handle(client_t *c, pn_event_t *e) {
  switch (pn_event_type(e)) {
  case PN_CONNECTION_INIT: {
    c->connection = pn_event_connection(e);
    pn_connection_set_container(c->connection, c->sending ? "latency-send" : "latency-receive");
    pn_connection_open(c->connection);
    pn_session_t *s = pn_session(c->connection);
    pn_session_open(s);
    if (c->sending) {
      c->link = pn_sender(s, "latency-send");
      pn_terminus_set_address(pn_link_target(c->link), c->address);
    } else {
      c->link = pn_receiver(s, "latency-receive");
      pn_terminus_set_address(pn_link_source(c->link), c->address);
    }
    pn_link_set_snd_settle_mode(c->link, PN_SND_UNSETTLED);
    pn_link_set_rcv_settle_mode(c->link, PN_RCV_FIRST);
    pn_link_open(c->link);
    if (c->sending) {
      pn_proactor_set_timeout(c->proactor, TICK_MS);
    } else {
      pn_link_flow(c->link, CREDIT_WINDOW);
    }
    break;
  }
  case PN_PROACTOR_TIMEOUT:
    /* The timeout belongs to the proactor, not the connection: wake the connection and
       send from its own events, where writes are flushed. */
    if (c->sent < c->count && !c->error[0] && !c->closed) {
      pn_connection_wake(c->connection);
      pn_proactor_set_timeout(c->proactor, TICK_MS);
    }
    break;
  case PN_CONNECTION_WAKE:
  case PN_LINK_FLOW:
    if (c->sending) send_due(c);
    break;
  case PN_DELIVERY:
    if (c->sending) {
      outcome(c, pn_event_delivery(e));
    } else {
      receive(c, pn_event_delivery(e));
    }
    break;
  case PN_TRANSPORT_CLOSED:
    c->closed = true;
    check(c, "transport", pn_transport_condition(pn_event_transport(e)));
    break;
  case PN_CONNECTION_REMOTE_CLOSE:
    check(c, "connection closed", pn_connection_remote_condition(pn_event_connection(e)));
    pn_connection_close(pn_event_connection(e));
    break;
  case PN_SESSION_REMOTE_CLOSE:
    check(c, "session closed", pn_session_remote_condition(pn_event_session(e)));
    pn_connection_close(pn_event_connection(e));
    break;
  case PN_LINK_REMOTE_CLOSE:
  case PN_LINK_REMOTE_DETACH:
    check(c, "link closed", pn_link_remote_condition(pn_event_link(e)));
    pn_connection_close(pn_event_connection(e));
    break;
  case PN_PROACTOR_INACTIVE:
    return false;
  default:
    break;
  }
  return true;
}

static void print_result(client_t *c) {
  long done = c->sending ? c->accepted : c->received;
  if (!c->error[0] && done != c->count) {
    snprintf(c->error, sizeof c->error, "%ld of %ld %s", done, c->count, c->sending ? "accepted" : "received");
  }
  printf("{\"role\": \"%s\", \"count\": %ld, \"sent\": %ld, \"first\": %.6f, \"last\": %.6f, \"error\": ",
         c->sending ? "produce" : "consume", done, c->sent, c->first, c->last);
  if (c->error[0]) {
    putchar('"');
    for (const char *p = c->error; *p; p++) {
      if (*p == '"' || *p == '\\') putchar('\\');
      putchar((unsigned char)*p >= ' ' ? *p : ' ');
    }
    putchar('"');
  } else {
    fputs("null", stdout);
  }
  if (!c->sending) {
    fputs(", \"latencies_ms\": [", stdout);
    for (long i = 0; i < c->received; i++) printf(i ? ", %.4f" : "%.4f", c->latencies_ms[i]);
    putchar(']');
  }
  puts("}");
}

int main(int argc, char **argv) {
  client_t c = {0};
  bool send_mode = argc == 7 && strcmp(argv[1], "send") == 0;
  bool receive_mode = argc == 6 && strcmp(argv[1], "receive") == 0;
  if (!send_mode && !receive_mode) {
    fprintf(stderr, "usage: %s send HOST PORT ADDRESS COUNT RATE | receive HOST PORT ADDRESS COUNT\n", argv[0]);
    return 2;
  }
  c.sending = send_mode;
  c.address = argv[4];
  c.count = atol(argv[5]);
  c.rate = send_mode ? atof(argv[6]) : 0;
  if (c.count <= 0 || (send_mode && c.rate <= 0)) {
    fprintf(stderr, "COUNT and RATE must be positive\n");
    return 2;
  }
  if (!send_mode) c.latencies_ms = calloc((size_t)c.count, sizeof(double));
  c.message = pn_message();
  c.proactor = pn_proactor();
  char addr[PN_MAX_ADDR];
  pn_proactor_addr(addr, sizeof addr, argv[2], argv[3]);
  pn_proactor_connect2(c.proactor, NULL, NULL, addr);
  for (bool running = true; running;) {
    pn_event_batch_t *batch = pn_proactor_wait(c.proactor);
    for (pn_event_t *e = pn_event_batch_next(batch); e && running; e = pn_event_batch_next(batch)) {
      running = handle(&c, e);
    }
    pn_proactor_done(c.proactor, batch);
  }
  print_result(&c);
  pn_proactor_free(c.proactor);
  pn_message_free(c.message);
  free(c.buffer.start);
  free(c.latencies_ms);
  return c.error[0] ? 1 : 0;
}
