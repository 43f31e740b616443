'use strict';
// Drives the official RocketMQ 5.x Node.js client (npm rocketmq-client-nodejs, apache/rocketmq-clients nodejs/, gRPC)
// against the broker's gRPC endpoint for the interop tests.
// argv[2]: JSON {endpoint, producerTopics?, pushConsumers?: [{group, topic, expr}],
//   simpleConsumers?: [{group, topic, expr} or {group, subscriptions: {topic: expr}}], receive?: bool, accessKey?,
//   secretKey?, heartbeatIntervalMs? (the period of the clients' Heartbeat: 10 s in the client, shorter for a test
//   that watches several), tls? (the clients' sslEnabled: TLS with grpc-js's default roots,
//   GRPC_DEFAULT_SSL_ROOTS_FILE_PATH)}
// env: V5_NODE_DIR (the folder whose node_modules holds the client), HOME (the clients log to
//   $HOME/logs/rocketmq/rocketmq_client_nodejs.log, the client's default file, through one logger of the driver's: the
//   client's default egg-logger closes its file at the first client's shutdown, and the others' last lines then fail).
// stdout protocol: "READY <clientId> ..." once every client has started (one id per client: producer, push
// consumers, simple consumers), "RECEIVED <n>" per simple consumer with `receive` (one receive call), "CLOSED" after
// a "close" line on stdin; "FAILED <message>" when a client does not start.
const fs = require('fs');
const os = require('os');
const path = require('path');
const readline = require('readline');
const util = require('util');
const { Producer, PushConsumer, SimpleConsumer, ConsumeResult } =
  require(path.resolve(process.env.V5_NODE_DIR, 'node_modules', 'rocketmq-client-nodejs'));

const spec = JSON.parse(process.argv[2]);

const logDir = path.join(os.homedir(), 'logs', 'rocketmq');
fs.mkdirSync(logDir, { recursive: true });
const logFile = path.join(logDir, 'rocketmq_client_nodejs.log');
const logger = {};
for (const level of [ 'debug', 'info', 'warn', 'error' ]) {
  logger[level] = (...args) => {
    const line = `${new Date().toISOString()} ${level.toUpperCase()} ${util.format(...args)}\n`;
    fs.appendFileSync(logFile, line);
    if (level === 'warn' || level === 'error') {
      process.stderr.write(line);
    }
  };
}

function options(extra) {
  const o = Object.assign({ endpoints: spec.endpoint, namespace: '', logger, sslEnabled: spec.tls === true }, extra);
  if (spec.accessKey) {
    o.sessionCredentials = { accessKey: spec.accessKey, accessSecret: spec.secretKey || '' };
  }
  return o;
}

// BaseClient.startup arms its heartbeat as setInterval(doHeartbeat, 10000), its only 10 s timer
if (spec.heartbeatIntervalMs) {
  const setIntervalOrig = global.setInterval;
  global.setInterval = (fn, ms, ...args) =>
    setIntervalOrig(fn, ms === 10000 ? spec.heartbeatIntervalMs : ms, ...args);
}

async function main() {
  const clients = [];
  const simple = [];
  try {
    if (spec.producerTopics && spec.producerTopics.length) {
      const producer = new Producer(options({ topics: spec.producerTopics }));
      await producer.startup();
      clients.push(producer);
    }
    for (const c of spec.pushConsumers || []) {
      const consumer = new PushConsumer(options({
        consumerGroup: c.group,
        subscriptions: new Map([[ c.topic, c.expr || '*' ]]),
        messageListener: { consume: () => ConsumeResult.SUCCESS },
      }));
      await consumer.startup();
      clients.push(consumer);
    }
    for (const c of spec.simpleConsumers || []) {
      const consumer = new SimpleConsumer(options({
        consumerGroup: c.group,
        subscriptions: new Map(c.subscriptions ? Object.entries(c.subscriptions).map(([ t, e ]) => [ t, e || '*' ])
          : [[ c.topic, c.expr || '*' ]]),
        awaitDuration: 5000,
      }));
      await consumer.startup();
      clients.push(consumer);
      simple.push(consumer);
    }
  } catch (err) {
    const cause = err && err.cause ? ` (cause: ${err.cause && err.cause.message || err.cause})` : '';
    process.stderr.write(`DRIVER ERROR ${err && err.stack || err}${cause}\n`);
    process.stdout.write(`FAILED ${err && err.message}${cause}\n`);
    process.exit(1);
  }
  process.stdout.write(`READY ${clients.map(c => c.clientId).join(' ')}\n`);
  if (spec.receive) {
    for (const consumer of simple) {
      const messages = await consumer.receive(16, 15000);
      process.stdout.write(`RECEIVED ${(messages || []).length}\n`);
    }
  }
  const rl = readline.createInterface({ input: process.stdin });
  for await (const line of rl) {
    if (line.trim() === 'close') {
      break;
    }
  }
  for (const c of clients) {
    await c.shutdown();
  }
  process.stdout.write('CLOSED\n');
  process.exit(0);
}

main().catch(err => {
  process.stderr.write(`DRIVER ERROR ${err && err.stack || err}\n`);
  process.stdout.write(`FAILED ${err && err.message}\n`);
  process.exit(1);
});
