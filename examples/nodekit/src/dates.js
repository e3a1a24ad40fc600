// Date helpers over dayjs, always in UTC.
import dayjs from 'dayjs';
import utc from 'dayjs/plugin/utc';
import relativeTime from 'dayjs/plugin/relativeTime';

dayjs.extend(utc);
dayjs.extend(relativeTime);

export function isoDay(date) {
  return dayjs.utc(date).format('YYYY-MM-DD');
}

export function addDays(date, n) {
  return dayjs.utc(date).add(n, 'day').format('YYYY-MM-DD');
}

export function weekday(date) {
  return dayjs.utc(date).format('dddd');
}

export function ago(date, now) {
  return dayjs.utc(date).from(dayjs.utc(now));
}

export function daysBetween(a, b) {
  return dayjs.utc(b).diff(dayjs.utc(a), 'day');
}
