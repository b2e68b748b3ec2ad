#!/usr/bin/env node
// A tiny rhea (JavaScript AMQP 1.0) client for the differential tests: a second client library,
// written by others, talking to the broker directly or through qpid-flow.
//
//   node client.js URL send ADDRESS COUNT [TIMEOUT_MS]     send "rhea-0".."rhea-(COUNT-1)" at-least-once
//   node client.js URL receive ADDRESS COUNT [TIMEOUT_MS]  grant COUNT credit, accept COUNT messages
//   node client.js URL request ADDRESS COUNT [TIMEOUT_MS]  send COUNT requests to ADDRESS with reply-to
//                                                          a dynamic (temporary) queue, accept COUNT replies
//
// URL is amqp[s]://[user:password@]host:port (SASL PLAIN when a user is given, else ANONYMOUS).
// amqps: TLS, trusting the CA in $RHEA_TLS_CA (PEM file); $RHEA_TLS_CERT / $RHEA_TLS_KEY give a
// client certificate, and with one and no user, SASL EXTERNAL is used.
// Never reconnects. Prints one JSON line on stdout and exits 0 (the report says what happened):
//   {"op", "address", "sent", "outcomes": {"accepted": n, ...}, "received": [bodies],
//    "deliveries": [[body, delivery_count, first_acquirer]], "first_credit": n (send),
//    "reply_to": address (request), "peer": {"container_id", "properties"} (the open frame),
//    "errors": [[level, condition]], "timed_out": bool}
// Requires the rhea package in ./node_modules (bash .ci/install-deps).
'use strict';

const path = require('path');
const rhea = require(path.join(__dirname, 'node_modules', 'rhea'));

const [url, op, address, countArg, timeoutArg] = process.argv.slice(2);
if (!url || !['send', 'receive', 'request'].includes(op) || !address) {
    process.stderr.write('usage: client.js URL send|receive|request ADDRESS COUNT [TIMEOUT_MS]\n');
    process.exit(2);
}
const count = parseInt(countArg || '10', 10);
const timeoutMs = parseInt(timeoutArg || '10000', 10);
const u = new URL(url);

const report = { op, address, sent: 0, outcomes: {}, received: [], deliveries: [], errors: [], timed_out: false };
let finished = false;

function finish(connection) {
    if (finished) return;
    finished = true;
    clearTimeout(timer);
    process.stdout.write(JSON.stringify(report) + '\n');
    if (connection && connection.is_open()) {
        connection.close();
        // Leave after the close handshake, or soon if the peer never answers.
        connection.once('connection_close', () => process.exit(0));
        setTimeout(() => process.exit(0), 2000).unref();
    } else {
        process.exit(0);
    }
}

function errorName(context, level) {
    const err = context.error || (context[level] && context[level].error);
    return err && err.condition ? String(err.condition) : null;
}

const container = rhea.create_container({ id: `rhea-${process.pid}-${Date.now()}` });
const options = { host: u.hostname, port: parseInt(u.port || '5672', 10), reconnect: false };
if (u.username) {
    options.username = decodeURIComponent(u.username);
    options.password = decodeURIComponent(u.password);
}
if (u.protocol === 'amqps:') {
    const fs = require('fs');
    options.transport = 'tls';
    options.servername = u.hostname;
    if (process.env.RHEA_TLS_CA) options.ca = [fs.readFileSync(process.env.RHEA_TLS_CA)];
    if (process.env.RHEA_TLS_CERT) {
        options.cert = fs.readFileSync(process.env.RHEA_TLS_CERT);
        options.key = fs.readFileSync(process.env.RHEA_TLS_KEY);
        if (!u.username) options.enable_sasl_external = true;
    }
}
const connection = container.connect(options);
const timer = setTimeout(() => {
    report.timed_out = true;
    finish(connection);
}, timeoutMs);

container.on('connection_error', (context) => report.errors.push(['connection', errorName(context, 'connection')]));
container.on('session_error', (context) => report.errors.push(['session', errorName(context, 'session')]));
container.on('sender_error', (context) => report.errors.push(['link', errorName(context, 'sender')]));
container.on('receiver_error', (context) => report.errors.push(['link', errorName(context, 'receiver')]));
container.on('error', (e) => report.errors.push(['transport', String((e && e.code) || e)]));
container.on('disconnected', (context) => {
    if (!finished) {
        report.errors.push(['transport', context.error ? String(context.error.code || context.error) : 'disconnected']);
        finish(null);
    }
});
// On the connection, not the container: rhea gives an event to the container only when the
// connection has no listener of its own for it.
connection.on('connection_open', (context) => {
    const open = context.connection.remote.open;
    report.peer = { container_id: open.container_id, properties: open.properties || {} };
    if (op === 'send' && count === 0) finish(context.connection);
});
container.on('connection_close', () => {
    if (!finished) finish(null);
});

if (op === 'send') {
    const sender = connection.open_sender(address);
    let settled = 0;
    const outcome = (name) => (context) => {
        report.outcomes[name] = (report.outcomes[name] || 0) + 1;
        settled += 1;
        if (settled === count) finish(context.connection);
    };
    sender.on('sendable', (context) => {
        if (report.first_credit === undefined) report.first_credit = context.sender.credit;
        while (context.sender.sendable() && report.sent < count) {
            context.sender.send({ body: `rhea-${report.sent}` });
            report.sent += 1;
        }
    });
    sender.on('accepted', outcome('accepted'));
    sender.on('rejected', outcome('rejected'));
    sender.on('released', outcome('released'));
    sender.on('modified', outcome('modified'));
} else if (op === 'request') {
    // The request/response pattern of Proton's client.py: replies come to a queue the broker
    // makes for this link (a dynamic source), named in its attach answer.
    const replies = connection.open_receiver({ source: { dynamic: true }, credit_window: 0, autoaccept: false });
    replies.on('receiver_open', (context) => {
        report.reply_to = context.receiver.source.address;
        context.receiver.add_credit(count);
        const requests = connection.open_sender(address);
        requests.on('sendable', (ctx) => {
            while (ctx.sender.sendable() && report.sent < count) {
                ctx.sender.send({ body: `rhea-${report.sent}`, reply_to: report.reply_to });
                report.sent += 1;
            }
        });
    });
    replies.on('message', (context) => {
        const message = context.message;
        report.deliveries.push([message.body, message.delivery_count || 0, Boolean(message.first_acquirer)]);
        if (process.env.RHEA_FAIL_FIRST && report.deliveries.length === 1) {
            context.delivery.modified({ delivery_failed: true });
            context.receiver.add_credit(1);
            return;
        }
        report.received.push(message.body);
        context.delivery.accept();
        if (report.received.length === count) finish(context.connection);
    });
} else {
    // $RHEA_FAIL_FIRST=1: the first message that arrives is answered modified(delivery-failed)
    // and not counted (it comes back with delivery-count raised).
    // $RHEA_SELECTOR: a JMS selector filter on the source; $RHEA_BROWSE=1: distribution-mode copy.
    const source = { address };
    if (process.env.RHEA_SELECTOR) source.filter = rhea.filter.selector(process.env.RHEA_SELECTOR);
    if (process.env.RHEA_BROWSE) source.distribution_mode = 'copy';
    const receiver = connection.open_receiver({ source, credit_window: 0, autoaccept: false });
    receiver.add_credit(count);
    receiver.on('message', (context) => {
        if (report.received.length >= count) {
            context.delivery.release({ delivered: false }); // beyond our credit (RabbitMQ does it)
            return;
        }
        const message = context.message;
        report.deliveries.push([message.body, message.delivery_count || 0, Boolean(message.first_acquirer)]);
        if (process.env.RHEA_FAIL_FIRST && report.deliveries.length === 1) {
            context.delivery.modified({ delivery_failed: true });
            context.receiver.add_credit(1);
            return;
        }
        report.received.push(message.body);
        context.delivery.accept();
        if (report.received.length === count) finish(context.connection);
    });
}
